// The manager registry, the ops as the dispatcher sees them, and the OffloadManager custom class.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/custom_class.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "csrc/manager.h"
#include "csrc/manager_registry.h"
#include "csrc/save_decision.h"
#include "fake_transfer.h"
#include "test_util.h"
#include "torch_library/offload_manager.h"

namespace torch_offload {
namespace {

using testing::error_of;
using testing::FakeTransfer;

auto save_op() {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow("offload::offload_save", "")
      .typed<at::Tensor(const at::Tensor&, int64_t)>();
}

auto restore_op() {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow("offload::offload_restore", "")
      .typed<at::Tensor(const at::Tensor&, c10::Device, int64_t)>();
}

// ---------------------------------------------------------------------------------------------
// Registry.

TEST(ManagerRegistryTest, UnknownIdThrowsAClearError) {
  const std::string message = error_of([] { find_manager(987654321); });
  EXPECT_NE(message.find("unknown OffloadManager id"), std::string::npos) << message;
  EXPECT_NE(message.find("987654321"), std::string::npos) << message;
}

TEST(ManagerRegistryTest, IdsAreDistinctAndFindReturnsTheManager) {
  auto a = Manager::create(ManagerConfig{}, std::make_shared<FakeTransfer>());
  auto b = Manager::create(ManagerConfig{}, std::make_shared<FakeTransfer>());
  EXPECT_NE(a->id(), b->id());
  EXPECT_EQ(find_manager(a->id()), a);
  EXPECT_EQ(find_manager(b->id()), b);
}

TEST(ManagerRegistryTest, IdStaysValidWhileAHandleLivesAndDisappearsWithTheLast) {
  auto manager = Manager::create(ManagerConfig{}, std::make_shared<FakeTransfer>());
  const int64_t id = manager->id();
  at::Tensor x = at::arange(100, at::kFloat);
  at::Tensor h = manager->save(x);
  std::weak_ptr<Manager> weak = manager;
  manager.reset();

  // The handle keeps its manager alive: backward may run after the user dropped the manager.
  ASSERT_FALSE(weak.expired());
  auto found = find_manager(id);
  EXPECT_TRUE(at::equal(found->restore(h, c10::Device(c10::kCPU)), x));
  found.reset();

  h = at::Tensor();
  EXPECT_TRUE(weak.expired());
  const std::string message = error_of([&] { find_manager(id); });
  EXPECT_NE(message.find("unknown OffloadManager id"), std::string::npos) << message;
}

TEST(ManagerRegistryTest, ConcurrentCreateAndFind) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        auto m = Manager::create(ManagerConfig{}, std::make_shared<FakeTransfer>());
        if (find_manager(m->id()) != m) failures++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// Ops through the dispatcher.

TEST(OffloadOpsTest, SchemasAreRegistered) {
  auto save = c10::Dispatcher::singleton().findSchema({"offload::offload_save", ""});
  auto restore = c10::Dispatcher::singleton().findSchema({"offload::offload_restore", ""});
  ASSERT_TRUE(save.has_value());
  ASSERT_TRUE(restore.has_value());
  EXPECT_EQ(save->schema().arguments().size(), 2u);
  EXPECT_EQ(restore->schema().arguments().size(), 3u);
  EXPECT_TRUE(save->hasKernelForDispatchKey(c10::DispatchKey::CPU));
  EXPECT_TRUE(restore->hasKernelForDispatchKey(c10::DispatchKey::CPU));
}

TEST(OffloadOpsTest, SaveAndRestoreThroughTheDispatcherRoundTrip) {
  auto om = c10::make_intrusive<OffloadManager>(4, 1, 0);
  const int64_t id = om->id();
  std::vector<at::Tensor> xs = {at::randn({17, 5}), at::arange(1000, at::kLong),
                                at::randn({8, 8}).to(at::kBFloat16).t(), at::rand({33}).gt(0.5),
                                at::empty({0, 3})};
  std::vector<at::Tensor> hs;
  for (const auto& x : xs) hs.push_back(save_op().call(x, id));
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_TRUE(hs[i].is_cpu());
    EXPECT_EQ(hs[i].sizes(), xs[i].sizes());
  }
  for (size_t i = xs.size(); i-- > 0;) {
    at::Tensor y = restore_op().call(hs[i], c10::Device(c10::kCPU), id);
    EXPECT_EQ(y.scalar_type(), xs[i].scalar_type()) << i;
    EXPECT_TRUE(at::equal(y, xs[i])) << i;
  }
  auto stats = om->stats();
  EXPECT_EQ(stats.at("saves"), 5.0);
  EXPECT_EQ(stats.at("restores"), 5.0);
  EXPECT_EQ(stats.at("live_handles"), 5.0);
  hs.clear();
  om->synchronize();
  EXPECT_EQ(om->stats().at("live_handles"), 0.0);
  EXPECT_EQ(om->stats().at("host_bytes_in_use"), 0.0);
}

TEST(OffloadOpsTest, OpsWithAnUnknownManagerIdThrow) {
  const std::string message = error_of([] { save_op().call(at::ones({3}), 123456789); });
  EXPECT_NE(message.find("unknown OffloadManager id"), std::string::npos) << message;
  EXPECT_THROW(restore_op().call(at::ones({3}), c10::Device(c10::kCPU), 123456789), c10::Error);
}

TEST(OffloadOpsTest, OpsDetectInPlaceModification) {
  auto om = c10::make_intrusive<OffloadManager>(4, 1, 0);
  at::Tensor x = at::randn({10});
  at::Tensor h = save_op().call(x, om->id());
  x.add_(1);
  const std::string message =
      error_of([&] { restore_op().call(h, c10::Device(c10::kCPU), om->id()); });
  EXPECT_NE(message.find("modified in place"), std::string::npos) << message;
}

TEST(OffloadOpsTest, RestoreToADeviceThisProcessCannotReachNamesTheOpAndTheDevice) {
  // Without a GPU, asking CUDA which device is current fails with the driver's own error; the
  // restore checks first.
  if (torch::cuda::is_available()) GTEST_SKIP() << "checks the error on a machine without CUDA";
  auto om = c10::make_intrusive<OffloadManager>(4, 1, 0);
  at::Tensor x = at::randn({10});
  at::Tensor h = save_op().call(x, om->id());
  for (const char* device : {"cuda", "cuda:0"}) {
    const std::string message =
        error_of([&] { restore_op().call(h, c10::Device(device), om->id()); });
    EXPECT_EQ(message.rfind(std::string("offload_restore: device='") + device +
                                "', but no CUDA device is visible to this process",
                            0),
              0u)
        << message;
  }
  const std::string meta = error_of([&] { restore_op().call(h, c10::Device("meta"), om->id()); });
  EXPECT_NE(meta.find("offload_restore: device='meta' is not supported"), std::string::npos)
      << meta;
  EXPECT_TRUE(at::equal(restore_op().call(h, c10::Device(c10::kCPU), om->id()), x));
}

TEST(OffloadOpsTest, HandlesOutliveTheOffloadManagerObject) {
  auto om = c10::make_intrusive<OffloadManager>(4, 1, 0);
  const int64_t id = om->id();
  at::Tensor x = at::randn({64});
  at::Tensor h = save_op().call(x, id);
  om.reset();  // e.g. the module holding it was deleted before backward ran
  EXPECT_TRUE(at::equal(restore_op().call(h, c10::Device(c10::kCPU), id), x));
  h = at::Tensor();
  EXPECT_THROW(find_manager(id), c10::Error);
}

// ---------------------------------------------------------------------------------------------
// The OffloadManager custom class.

TEST(OffloadManagerClassTest, ConfigAccessorsAndStats) {
  auto om = c10::make_intrusive<OffloadManager>(3, 2, 1 << 20);
  EXPECT_EQ(om->max_in_flight(), 3);
  EXPECT_EQ(om->prefetch_depth(), 2);
  EXPECT_EQ(om->host_budget_bytes(), 1 << 20);
  auto stats = om->stats();
  for (const char* key : {"bytes_to_host", "bytes_to_device", "saves", "restores", "prefetches",
                          "prefetch_hits", "host_bytes_in_use", "host_allocations", "pinned",
                          "live_handles", "compute_wait_ms", "host_wait_ms"}) {
    EXPECT_TRUE(stats.contains(key)) << key;
  }
  EXPECT_EQ(stats.at("bytes_to_host"), 0.0);

  at::Tensor x = at::randn({25});
  at::Tensor h = save_op().call(x, om->id());
  EXPECT_EQ(om->stats().at("bytes_to_host"), 100.0);
  om->reset_stats();
  EXPECT_EQ(om->stats().at("bytes_to_host"), 0.0);
  EXPECT_EQ(om->stats().at("live_handles"), 1.0);
}

// Whatever the pickled state holds, it is what state() returns.
using State = decltype(std::declval<const OffloadManager&>().state());

TEST(OffloadManagerClassTest, StateRoundTripKeepsConfig) {
  auto om = c10::make_intrusive<OffloadManager>(7, 3, 12345678);
  const State state = om->state();
  auto loaded = OffloadManager::from_state(state);
  EXPECT_EQ(loaded->max_in_flight(), 7);
  EXPECT_EQ(loaded->prefetch_depth(), 3);
  EXPECT_EQ(loaded->host_budget_bytes(), 12345678);
  EXPECT_TRUE(loaded->state() == state) << "every configured value survives the round trip";
  EXPECT_NE(loaded->id(), om->id()) << "a loaded manager is a new engine";
  EXPECT_EQ(loaded->stats().at("saves"), 0.0);
  EXPECT_THROW(OffloadManager::from_state(State{}), c10::Error) << "an empty state is rejected";
}

// disk_io_threads is the 9th value; a state saved before it (8 values) loads with the default.
TEST(OffloadManagerClassTest, StateKeepsDiskIoThreadsAndLoadsOlderStates) {
  const testing::TempDir dir;
  auto om = c10::make_intrusive<OffloadManager>(4, 1, 0, false, dir.path(), /*disk_only=*/true,
                                                false, 0, false, false, /*disk_io_threads=*/7);
  State state = om->state();
  ASSERT_EQ(std::get<0>(state).size(), 9u);
  EXPECT_EQ(OffloadManager::from_state(state)->disk_io_threads(), 7);
  std::get<0>(state).pop_back();
  auto older = OffloadManager::from_state(state);
  EXPECT_EQ(older->disk_io_threads(), ManagerConfig{}.disk_io_threads);
  EXPECT_TRUE(older->disk_only());
  std::get<0>(state).resize(10);
  EXPECT_THROW(OffloadManager::from_state(state), c10::Error) << "a state from a newer version";
}

TEST(OffloadManagerClassTest, InvalidConfigIsRejected) {
  EXPECT_THROW(c10::make_intrusive<OffloadManager>(-1, 1, 0), c10::Error);
  EXPECT_THROW(c10::make_intrusive<OffloadManager>(4, -1, 0), c10::Error);
  EXPECT_THROW(c10::make_intrusive<OffloadManager>(4, 1, -5), c10::Error);
  const testing::TempDir dir;
  const std::string error = error_of([&] {
    c10::make_intrusive<OffloadManager>(4, 1, 0, false, dir.path() + std::string(1, '\0') + "x",
                                        /*disk_only=*/true);
  });
  EXPECT_NE(error.find("disk_dir contains a NUL character"), std::string::npos) << error;
}

// What the Python package reads from the library instead of repeating it: every statistic once,
// with stats() reporting exactly those; the manager's defaults, as the class applies them; the
// filter's decisions by name.
TEST(EngineConstantsTest, StatNamesAreStatsKeysInOrderAndUnique) {
  const auto names = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("offload::stat_names", "")
                         .typed<std::vector<std::string>()>()
                         .call();
  const auto& declared = OffloadStats::names;
  ASSERT_EQ(names, std::vector<std::string>(declared.begin(), declared.end()));
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
  std::vector<std::string> items;
  for (const auto& [name, value] : OffloadStats{}.items()) items.push_back(name);
  EXPECT_EQ(items, names);
  auto om = c10::make_intrusive<OffloadManager>(4, 1, 0);
  const auto stats = om->stats();
  EXPECT_EQ(stats.size(), names.size());
  for (const std::string& name : names) EXPECT_TRUE(stats.contains(name)) << name;
}

TEST(EngineConstantsTest, ManagerDefaultsAreThoseTheClassApplies) {
  const auto defaults = c10::Dispatcher::singleton()
                            .findSchemaOrThrow("offload::manager_defaults", "")
                            .typed<c10::Dict<std::string, int64_t>()>()
                            .call();
  const ManagerConfig config;
  EXPECT_EQ(defaults.at("max_in_flight"), config.max_in_flight);
  EXPECT_EQ(defaults.at("prefetch_depth"), config.prefetch_depth);
  EXPECT_EQ(defaults.at("host_budget_bytes"), config.host_budget_bytes);
  EXPECT_EQ(defaults.at("keep_on_device_bytes"), config.keep_on_device_bytes);
  // The defaults of the class's constructor, which TorchScript and Python apply.
  auto cls = torch::getCustomClass("__torch__.torch.classes.offload.OffloadManager");
  ASSERT_NE(cls, nullptr);
  const auto& arguments = cls->getMethod("__init__").getSchema().arguments();
  int64_t checked = 0;
  for (const c10::Argument& argument : arguments) {
    if (!defaults.contains(argument.name())) continue;
    ASSERT_TRUE(argument.default_value().has_value()) << argument.name();
    EXPECT_EQ(argument.default_value()->toInt(), defaults.at(argument.name())) << argument.name();
    checked++;
  }
  EXPECT_EQ(checked, static_cast<int64_t>(defaults.size()));
  auto om = c10::make_intrusive<OffloadManager>(config.max_in_flight, config.prefetch_depth,
                                                config.host_budget_bytes);
  EXPECT_EQ(om->keep_on_device_bytes(), defaults.at("keep_on_device_bytes"));
}

TEST(EngineConstantsTest, SaveDecisionsByName) {
  const auto decisions = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("offload::save_decisions", "")
                             .typed<c10::Dict<std::string, int64_t>()>()
                             .call();
  ASSERT_EQ(decisions.size(), kSaveDecisionNames.size());
  EXPECT_EQ(decisions.at("offload"), static_cast<int64_t>(SaveDecision::kOffload));
  EXPECT_EQ(decisions.at("keep"), static_cast<int64_t>(SaveDecision::kKeep));
  EXPECT_EQ(decisions.at("caller_decides"), static_cast<int64_t>(SaveDecision::kCallerDecides));
  EXPECT_EQ(decisions.at("leaf_without_grad"),
            static_cast<int64_t>(SaveDecision::kLeafWithoutGrad));
}

TEST(OffloadManagerClassTest, CustomClassIsRegisteredWithPickleSupport) {
  auto cls = torch::getCustomClass("__torch__.torch.classes.offload.OffloadManager");
  ASSERT_NE(cls, nullptr);
  for (const char* method :
       {"__init__", "id", "stats", "reset_stats", "synchronize", "empty_pool", "max_in_flight",
        "prefetch_depth", "host_budget_bytes", "__getstate__", "__setstate__"}) {
    EXPECT_NE(cls->findMethod(method), nullptr) << method;
  }

  // Call __getstate__ the way TorchScript serialization does.
  auto om = c10::make_intrusive<OffloadManager>(5, 0, 4096);
  torch::jit::Stack stack{c10::IValue(om)};
  cls->getMethod("__getstate__").run(stack);
  ASSERT_EQ(stack.size(), 1u);
  const State state = stack[0].to<State>();
  EXPECT_TRUE(state == om->state());
  auto loaded = OffloadManager::from_state(state);
  EXPECT_EQ(loaded->max_in_flight(), 5);
  EXPECT_EQ(loaded->prefetch_depth(), 0);
  EXPECT_EQ(loaded->host_budget_bytes(), 4096);
}

}  // namespace
}  // namespace torch_offload
