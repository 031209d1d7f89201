#pragma once
// The host tier: each saved tensor's bytes live in a buffer of the pool (pinned when a CUDA device
// exists), and the handle is that buffer.
#include <memory>

#include "host_buffer_pool.h"
#include "tier.h"

namespace torch_offload {

class HostTier : public Tier {
 public:
  explicit HostTier(std::shared_ptr<HostBufferPool> pool) : pool_(std::move(pool)) {}
  std::shared_ptr<StoredTensor> reserve(size_t nbytes, bool may_decline) override;
  void add_stats(OffloadStats& stats) override;
  void reset_stats() override { pool_->reset_counters(); }
  void empty_cache() override { pool_->empty_cache(); }
  bool pinned() const { return pool_->pinned(); }

 private:
  std::shared_ptr<HostBufferPool> pool_;
};

}  // namespace torch_offload
