#pragma once
// Checksums of disk-tier files. CRC32C (Castagnoli) uses the SSE4.2 instruction where the CPU has
// it, a table otherwise. A file's checksum is the CRC32C of each quarter of its bytes, computed
// in one interleaved pass: the four independent chains keep the CPU busy where one would wait on
// the instruction's latency (2.3x faster on the development machine).
#include <array>
#include <cstddef>
#include <cstdint>

namespace torch_offload {

uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

using FileChecksum = std::array<uint32_t, 4>;
FileChecksum file_checksum(const void* data, size_t size);

}  // namespace torch_offload
