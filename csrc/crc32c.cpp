#include "crc32c.h"

#include <algorithm>
#include <cstring>

namespace torch_offload {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78;  // CRC32C, bit-reflected

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

// Both take and return the register value (the complemented CRC).
uint32_t update_table(uint32_t c, const unsigned char* p, size_t size) {
  static const std::array<uint32_t, 256> table = make_table();
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t update_sse42(uint32_t c32, const unsigned char* p,
                                                        size_t size) {
  uint64_t c = c32;
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  c32 = static_cast<uint32_t>(c);
  for (; size > 0; --size, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return c32;
}

// Four chains over four runs of `words` 8-byte words each, `stride` bytes apart.
__attribute__((target("sse4.2"))) void update4_sse42(uint32_t* c, const unsigned char* p,
                                                     size_t stride, size_t words) {
  uint64_t c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
  for (size_t i = 0; i < words * 8; i += 8) {
    uint64_t w0, w1, w2, w3;
    std::memcpy(&w0, p + i, 8);
    std::memcpy(&w1, p + stride + i, 8);
    std::memcpy(&w2, p + 2 * stride + i, 8);
    std::memcpy(&w3, p + 3 * stride + i, 8);
    c0 = __builtin_ia32_crc32di(c0, w0);
    c1 = __builtin_ia32_crc32di(c1, w1);
    c2 = __builtin_ia32_crc32di(c2, w2);
    c3 = __builtin_ia32_crc32di(c3, w3);
  }
  c[0] = static_cast<uint32_t>(c0);
  c[1] = static_cast<uint32_t>(c1);
  c[2] = static_cast<uint32_t>(c2);
  c[3] = static_cast<uint32_t>(c3);
}

bool have_sse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

uint32_t update(uint32_t c, const unsigned char* p, size_t size) {
#if defined(__x86_64__)
  if (have_sse42()) return update_sse42(c, p, size);
#endif
  return update_table(c, p, size);
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  return ~update(~crc, static_cast<const unsigned char*>(data), size);
}

void FileChecksummer::add(const void* slice, size_t size) {
  const auto* p = static_cast<const unsigned char*>(slice);
  const size_t run = (size / 4) & ~size_t{7};  // whole words; the last chain takes the rest
#if defined(__x86_64__)
  if (have_sse42()) {
    update4_sse42(chains_.data(), p, run, run / 8);
  } else
#endif
  {
    for (int k = 0; k < 4; ++k) chains_[k] = update_table(chains_[k], p + k * run, run);
  }
  chains_[3] = update(chains_[3], p + 4 * run, size - 4 * run);
}

FileChecksum FileChecksummer::value() const {
  return FileChecksum{~chains_[0], ~chains_[1], ~chains_[2], ~chains_[3]};
}

FileChecksum file_checksum(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  FileChecksummer checksum;
  for (size_t done = 0; done < size; done += kChecksumSlice) {
    checksum.add(p + done, std::min(kChecksumSlice, size - done));
  }
  return checksum.value();
}

}  // namespace torch_offload
