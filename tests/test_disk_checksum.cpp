// The disk tier's checksum: CRC32C as the standard defines it, the file checksum's layout (four
// chains over each slice's runs, which the SSE4.2 path must match byte for byte), and files of
// several slices written and read through the page cache and around it, a changed byte in any
// slice caught on read.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "csrc/crc32c.h"
#include "csrc/disk_store.h"
#include "test_util.h"

namespace torch_offload {
namespace {

using testing::TempDir;

std::vector<unsigned char> random_bytes(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> bytes(n);
  for (auto& b : bytes) b = static_cast<unsigned char>(gen());
  return bytes;
}

// CRC32C bit by bit (reflected polynomial 0x82F63B78), on the register value: the reference the
// table and the SSE4.2 instruction must agree with.
uint32_t crc_bits(uint32_t c, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  return c;
}

// The file checksum as crc32c.h defines it, written out plainly.
FileChecksum reference_file_checksum(const unsigned char* p, size_t size) {
  uint32_t c[4] = {~0u, ~0u, ~0u, ~0u};
  for (size_t done = 0; done < size; done += kChecksumSlice) {
    const size_t n = std::min(kChecksumSlice, size - done);
    const size_t run = n / 4 / 8 * 8;
    for (int k = 0; k < 4; ++k) c[k] = crc_bits(c[k], p + done + k * run, run);
    c[3] = crc_bits(c[3], p + done + 4 * run, n - 4 * run);
  }
  return FileChecksum{~c[0], ~c[1], ~c[2], ~c[3]};
}

TEST(Crc32c, IsTheCastagnoliChecksum) {
  const char* check = "123456789";
  EXPECT_EQ(crc32c(check, 9), 0xe3069283u) << "the standard check value";
  EXPECT_EQ(crc32c(check, 0), 0u);
  EXPECT_EQ(crc32c(check + 4, 5, crc32c(check, 4)), 0xe3069283u) << "continued over two calls";
  const auto bytes = random_bytes(1000, 1);
  EXPECT_EQ(crc32c(bytes.data(), bytes.size()), ~crc_bits(~0u, bytes.data(), bytes.size()));
}

// Sizes around a word, a slice and several slices: every chain and every leftover byte.
TEST(FileChecksum, IsFourChainsOverTheRunsOfEachSlice) {
  const size_t s = kChecksumSlice;
  const auto bytes = random_bytes(3 * s + 77, 2);
  for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{31}, size_t{32},
                      size_t{33}, size_t{4101}, s - 1, s, s + 1, 3 * s + 77}) {
    EXPECT_EQ(file_checksum(bytes.data(), size), reference_file_checksum(bytes.data(), size))
        << size;
  }
}

// One changed byte anywhere changes the checksum: run starts, a slice's last byte, the leftovers.
TEST(FileChecksum, EveryByteCounts) {
  const size_t s = kChecksumSlice, size = 2 * s + 45;
  auto bytes = random_bytes(size, 3);
  const FileChecksum original = file_checksum(bytes.data(), size);
  for (size_t at : {size_t{0}, s / 4, s / 2 + 3, s - 1, s, s + 3 * (45 / 4 / 8 * 8), size - 1}) {
    bytes[at] ^= 0x10;
    EXPECT_NE(file_checksum(bytes.data(), size), original) << at;
    bytes[at] ^= 0x10;
  }
  EXPECT_EQ(file_checksum(bytes.data(), size), original);
}

struct AlignedFree {
  void operator()(unsigned char* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<unsigned char, AlignedFree>;

Buffer aligned_buffer(size_t n) {
  const size_t block = DiskStore::kDirectIoBlock;
  return Buffer(
      static_cast<unsigned char*>(std::aligned_alloc(block, (n + block - 1) / block * block)));
}

std::string write_file(DiskStore& store, int64_t id, const unsigned char* data, size_t size) {
  std::promise<std::string> written;
  store.write_async(
      id, [] {}, data, size, [&](const std::string& e, bool) { written.set_value(e); });
  return written.get_future().get();
}

// Flips a bit of byte `at` in every file of `dir` this process holds open that long, as another
// process of the same user could through /proc. Returns how many files it changed.
int tamper_with_files_in(const std::string& dir, size_t at) {
  int changed = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (ec || target.rfind(dir + "/", 0) != 0) continue;
    FILE* f = std::fopen(entry.path().c_str(), "r+b");
    if (f == nullptr) continue;
    unsigned char byte = 0;
    if (std::fseek(f, static_cast<long>(at), SEEK_SET) == 0 && std::fread(&byte, 1, 1, f) == 1) {
      byte ^= 0x01;
      std::fseek(f, static_cast<long>(at), SEEK_SET);
      changed += std::fwrite(&byte, 1, 1, f) == 1;
    }
    std::fclose(f);
  }
  return changed;
}

// Through the page cache each slice is checksummed beside its transfer; around it the file moves
// whole. Either way a file of several slices comes back bit for bit, and a byte changed in its
// middle slice or its last is caught.
TEST(DiskChecksum, FilesOfSeveralSlicesComeBackAndAChangedByteInAnySliceIsCaught) {
  const size_t s = kChecksumSlice;
  for (DirectIo mode : {DirectIo::kNever, DirectIo::kAlways}) {
    for (size_t at : {s + 12345, 3 * s + 5}) {
      TempDir dir;
      DiskStore store(dir.path(), 1, mode);
      if (mode == DirectIo::kAlways && !store.direct_io()) continue;  // the filesystem refused
      const size_t size = 3 * s + 13;
      const auto bytes = random_bytes(size, 4);
      Buffer out = aligned_buffer(store.buffer_size(size)),
             in = aligned_buffer(store.buffer_size(size));
      std::memcpy(out.get(), bytes.data(), size);
      const int64_t id = store.new_file(size).id;
      ASSERT_EQ(write_file(store, id, out.get(), size), "");
      ASSERT_EQ(store.read(id, in.get(), size), "");
      EXPECT_EQ(std::memcmp(in.get(), bytes.data(), size), 0);
      const int64_t cached = store.bytes_read_from_page_cache();
      if (mode == DirectIo::kAlways) {
        EXPECT_EQ(cached, 0);
      } else if (cached >= 0) {
        EXPECT_EQ(cached, static_cast<int64_t>(size)) << "every slice was still in the page cache";
      }
      ASSERT_EQ(tamper_with_files_in(dir.path(), at), 1);
      const std::string error = store.read(id, in.get(), size);
      EXPECT_NE(error.find("do not match the checksum written"), std::string::npos)
          << "mode " << static_cast<int>(mode) << ", byte " << at << ": " << error;
    }
  }
}

}  // namespace
}  // namespace torch_offload
