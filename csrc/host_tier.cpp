#include "host_tier.h"

namespace torch_offload {
namespace {

class HostStored : public StoredTensor {
 public:
  HostStored(std::shared_ptr<HostBufferPool> pool, HostBlock block)
      : pool_(std::move(pool)), block_(block) {}
  void* destination() override { return block_.ptr; }
  void* handle_data() override { return block_.ptr; }
  bool views_restore_as_copies() const override { return true; }
  void commit(FencePtr) override {}
  const void* resident() override { return block_.ptr; }
  void read_ahead() override {}
  HostBytes bytes_for_restore() override { return HostBytes{block_.ptr, nullptr, false}; }
  std::function<void()> release() override {
    return [pool = pool_, block = block_] { pool->release(block); };
  }

 private:
  const std::shared_ptr<HostBufferPool> pool_;
  const HostBlock block_;
};

}  // namespace

std::shared_ptr<StoredTensor> HostTier::reserve(size_t nbytes, bool may_decline) {
  std::optional<HostBlock> block;
  if (may_decline) {
    block = pool_->try_acquire(nbytes);
    if (!block) return nullptr;
  } else {
    block = pool_->acquire(nbytes);  // over the budget: throws naming host_budget_bytes
  }
  return std::make_shared<HostStored>(pool_, *block);
}

void HostTier::add_stats(OffloadStats& s) {
  const PoolStats pool = pool_->stats();
  s.host_bytes_in_use = pool.bytes_in_use;
  s.host_bytes_peak = pool.bytes_peak;
  s.host_bytes_cached = pool.bytes_cached;
  s.pool_hits = pool.hits;
  s.pool_misses = pool.misses;
  s.host_allocations = pool.allocations;
  s.pinned = pool_->pinned();
}

}  // namespace torch_offload
