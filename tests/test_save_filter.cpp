// SaveFilter (csrc/save_filter.h), the save hooks' decision of which saves to offload: weights and
// kept storages stay, as do tensors under min_bytes; op outputs go; what the engine cannot tell is
// left to the caller; counts and the record of offloaded storages; a manager's filters by id.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "csrc/save_filter.h"

namespace torch_offload {
namespace {

// An activation: the output of an op, with autograd history.
torch::Tensor activation(std::vector<int64_t> sizes) {
  return torch::randn(sizes, torch::requires_grad()) * 2;
}

TEST(SaveFilterTest, OpOutputsAreOffloadedAndWeightsKept) {
  SaveFilter filter(/*min_bytes=*/0, /*record=*/false);
  const torch::Tensor weight = torch::randn({4, 4}, torch::requires_grad());
  EXPECT_EQ(filter.decide(activation({4, 4})), SaveDecision::kOffload);
  EXPECT_EQ(filter.decide(weight), SaveDecision::kKeep);
  EXPECT_EQ(filter.decide(weight.t()), SaveDecision::kKeep);  // what a linear saves
  const SaveFilter::StepCounts counts = filter.step_counts();
  EXPECT_EQ(counts.offloaded, 1);
  EXPECT_EQ(counts.kept_other, 2);
}

TEST(SaveFilterTest, AViewOfAnActivationIsOffloaded) {
  SaveFilter filter(0, false);
  const torch::Tensor h = activation({8, 4});
  EXPECT_EQ(filter.decide(h.t()), SaveDecision::kOffload);
  EXPECT_EQ(filter.decide(h.narrow(0, 2, 3)), SaveDecision::kOffload);
}

TEST(SaveFilterTest, KeptStoragesStayWhateverTheView) {
  SaveFilter filter(0, false);
  const torch::Tensor buffer = activation({6, 6});  // e.g. a buffer computed once
  filter.keep(buffer);
  EXPECT_EQ(filter.decide(buffer), SaveDecision::kKeep);
  EXPECT_EQ(filter.decide(buffer.narrow(1, 1, 2)), SaveDecision::kKeep);
  EXPECT_EQ(filter.decide(activation({6, 6})), SaveDecision::kOffload);
}

TEST(SaveFilterTest, TensorsUnderMinBytesStayAndTheLargestIsCounted) {
  SaveFilter filter(/*min_bytes=*/64, false);
  EXPECT_EQ(filter.decide(activation({4})), SaveDecision::kKeep);   // 16 bytes
  EXPECT_EQ(filter.decide(activation({12})), SaveDecision::kKeep);  // 48 bytes
  EXPECT_EQ(filter.decide(activation({16})), SaveDecision::kOffload);
  const SaveFilter::StepCounts counts = filter.step_counts();
  EXPECT_EQ(counts.under_min_bytes, 2);
  EXPECT_EQ(counts.largest_under_min_bytes, 48);
  OffloadStats stats;
  filter.add_stats(stats);
  EXPECT_EQ(stats.kept_saves, 2);
  EXPECT_EQ(stats.kept_bytes, 64);
  EXPECT_EQ(stats.saved_tensors, 2);  // the kept ones; the table counts the offloaded
  filter.reset_stats();
  OffloadStats after;
  filter.add_stats(after);
  EXPECT_EQ(after.kept_saves, 0);
  EXPECT_EQ(filter.step_counts().under_min_bytes, 2);  // the warning's counts are never reset
}

TEST(SaveFilterTest, WhatTheEngineCannotTellIsLeftToTheCaller) {
  SaveFilter filter(0, false);
  // A leaf without grad may be a frozen nn.Parameter (a Python notion) or a plain input.
  const torch::Tensor leaf = torch::randn({4, 4});
  EXPECT_EQ(filter.decide(leaf), SaveDecision::kLeafWithoutGrad);
  EXPECT_EQ(filter.decide(leaf.t()), SaveDecision::kLeafWithoutGrad);
  EXPECT_EQ(filter.decide(activation({0})), SaveDecision::kCallerDecides);  // no data
  const torch::Tensor complex = torch::randn({4}, torch::kComplexFloat) * 2;
  EXPECT_EQ(filter.decide(complex.conj()), SaveDecision::kCallerDecides);
  EXPECT_EQ(filter.decide(activation({4, 4}).to_sparse()), SaveDecision::kCallerDecides);
  const SaveFilter::StepCounts counts = filter.step_counts();
  EXPECT_EQ(counts.offloaded + counts.kept_other + counts.under_min_bytes, 0);
  // Told that the leaf is no weight, the engine decides it like an op's output: offloaded, or kept
  // under min_bytes, and counted either way. Saying so changes nothing for the tensors above.
  EXPECT_EQ(filter.decide(leaf.t(), /*not_a_weight=*/true), SaveDecision::kOffload);
  EXPECT_EQ(filter.decide(complex.conj(), true), SaveDecision::kCallerDecides);
  EXPECT_EQ(filter.step_counts().offloaded, 1);
  // A leaf under min_bytes stays whatever it is: the engine keeps it without asking.
  SaveFilter small_kept(1024, false);
  EXPECT_EQ(small_kept.decide(leaf), SaveDecision::kKeep);  // 64 bytes
  EXPECT_EQ(small_kept.decide(leaf.t(), true), SaveDecision::kKeep);
  EXPECT_EQ(small_kept.step_counts().under_min_bytes, 2);
  // A frozen weight on a kept storage is the engine's to keep, told or not.
  filter.keep(leaf);
  EXPECT_EQ(filter.decide(leaf.t()), SaveDecision::kKeep);
  EXPECT_EQ(filter.decide(leaf.t(), true), SaveDecision::kKeep);
}

TEST(SaveFilterTest, RecordsEachOffloadedStorageOnceAndSeesItFreed) {
  SaveFilter filter(0, /*record=*/true);
  torch::Tensor h = activation({8, 8});
  const torch::Tensor kept_alive = activation({4, 8});
  EXPECT_EQ(filter.decide(h), SaveDecision::kOffload);
  EXPECT_EQ(filter.decide(h.t()), SaveDecision::kOffload);  // the same storage: recorded once
  EXPECT_EQ(filter.decide(kept_alive), SaveDecision::kOffload);
  SaveFilter::Report report = filter.report();
  EXPECT_EQ(report.storages, 2);
  EXPECT_EQ(report.expected_bytes, 8 * 8 * 4 + 4 * 8 * 4);
  EXPECT_EQ(report.freed_bytes, 0);
  h = torch::Tensor();  // its storage dies
  report = filter.report();
  EXPECT_EQ(report.freed_bytes, 8 * 8 * 4);
  // A save the caller decided (a plain leaf without grad) is recorded through record().
  const torch::Tensor leaf = torch::randn({2, 8});
  EXPECT_EQ(filter.decide(leaf), SaveDecision::kLeafWithoutGrad);
  filter.record(leaf);
  filter.record(leaf.t());
  EXPECT_EQ(filter.report().storages, 3);
  // Told that a leaf is no weight, the filter records it itself.
  const torch::Tensor input = torch::randn({3, 8});
  EXPECT_EQ(filter.decide(input, /*not_a_weight=*/true), SaveDecision::kOffload);
  EXPECT_EQ(filter.report().storages, 4);
  filter.reset_record();
  EXPECT_EQ(filter.report().storages, 0);
}

TEST(SaveFilterTest, WithoutRecordNothingIsRecorded) {
  SaveFilter filter(0, false);
  EXPECT_EQ(filter.decide(activation({4})), SaveDecision::kOffload);
  filter.record(torch::randn({4}));
  EXPECT_EQ(filter.report().storages, 0);
}

TEST(SaveFilterTest, KeepingATensorWithoutStorageIsAnError) {
  SaveFilter filter(0, false);
  EXPECT_THROW(filter.keep(torch::Tensor()), c10::Error);
}

TEST(SaveFiltersTest, FiltersByIdAndTheirStatsSummed) {
  SaveFilters filters;
  const int64_t a = filters.add(0, false);
  const int64_t b = filters.add(1 << 20, false);
  EXPECT_NE(a, b);
  EXPECT_EQ(filters.get(b)->decide(activation({4})), SaveDecision::kKeep);
  EXPECT_EQ(filters.get(a)->decide(activation({4})), SaveDecision::kOffload);
  filters.get(a)->keep(torch::randn({2}));
  OffloadStats stats;
  filters.add_stats(stats);
  EXPECT_EQ(stats.kept_saves, 1);
  filters.reset_stats();
  OffloadStats after;
  filters.add_stats(after);
  EXPECT_EQ(after.kept_saves, 0);
  filters.remove(b);
  try {
    filters.get(b);
    FAIL() << "a removed filter was found";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("no save filter with id " + std::to_string(b)),
              std::string::npos);
  }
}

}  // namespace
}  // namespace torch_offload
