// Per-parameter dim-0 shard layouts (FSDP2's ceil-chunking with padding) and the torchrun environment: the slices of
// all ranks tile the rows exactly once, in rank order, for every shape and world size; padding sits only after the
// last real row; bad environments are refused naming the variable.
#include "trainer/parallel/dist_env.h"
#include "trainer/parallel/shard_layout.h"

#include "tests/support/env.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace fusepack::test {
namespace {

using parallel::DistEnv;
using parallel::ShardLayout;

TEST(ShardLayout, SlicesOfAllRanksTileTheRowsInRankOrderForEveryWorldSize) {
  for (std::int64_t rows : {0, 1, 2, 3, 5, 7, 10, 64, 100, 257}) {
    for (int world = 1; world <= 9; ++world) {
      std::int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        ShardLayout const l = ShardLayout::of({rows, 3}, r, world);
        EXPECT_EQ(l.begin, next) << "rows " << rows << " world " << world << " rank " << r;
        EXPECT_GE(l.local_rows, 0);
        EXPECT_LE(l.local_rows, l.chunk_rows);
        EXPECT_EQ(l.chunk_rows, (rows + world - 1) / world);
        EXPECT_EQ(l.row_numel, 3);
        next = l.end();
      }
      EXPECT_EQ(next, rows) << "rows " << rows << " world " << world;
    }
  }
}

// Whether the ranks' padded slices, laid end to end, hold every real row before any padding: what lets the gathered
// parameter be the first numel elements of the all-gather output. `layout(rows, rank, world)` gives a rank's slice.
template <typename Layout>
bool padding_only_after_the_rows(Layout const& layout, std::int64_t rows, int world) {
  bool padding_seen = false;
  for (int r = 0; r < world; ++r) {
    ShardLayout const l = layout(rows, r, world);
    for (std::int64_t i = 0; i < l.chunk_rows; ++i) {
      bool const real = i < l.local_rows;
      if (real && padding_seen) return false;
      padding_seen = padding_seen || !real;
    }
  }
  return true;
}

TEST(ShardLayout, PaddingComesOnlyAfterTheLastRealRow) {
  auto const ours = [](std::int64_t rows, int r, int world) { return ShardLayout::of({rows}, r, world); };
  // The planted layout: floor-sized slices with the remainder on the last rank, padded to the largest (a natural
  // alternative to ceil-chunking). Its early ranks carry padding before later ranks' rows, so the property must fail.
  auto const planted = [](std::int64_t rows, int r, int world) {
    ShardLayout l;
    std::int64_t const base = rows / world;
    l.chunk_rows = base + rows % world;
    l.begin = r * base;
    l.local_rows = r + 1 == world ? rows - l.begin : base;
    return l;
  };
  std::mt19937_64 rng = test_rng();
  bool planted_caught = false;
  for (int c = 0; c < cases(200, 5000); ++c) {
    std::int64_t const rows = static_cast<std::int64_t>(rng() % 300);
    int const world = 1 + static_cast<int>(rng() % 16);
    ASSERT_TRUE(padding_only_after_the_rows(ours, rows, world)) << "rows " << rows << " world " << world;
    planted_caught = planted_caught || !padding_only_after_the_rows(planted, rows, world);
  }
  EXPECT_TRUE(planted_caught) << "the property let the planted floor-chunk layout pass on every case";
}

TEST(ShardLayout, UnevenSizesGiveShortAndEmptySlices) {
  // 5 rows over 4 ranks: ceil 2 → 2, 2, 1, 0 (as torch.chunk, padded with an empty shard).
  std::vector<std::int64_t> got;
  for (int r = 0; r < 4; ++r) got.push_back(ShardLayout::of({5, 8}, r, 4).local_rows);
  EXPECT_EQ(got, (std::vector<std::int64_t>{2, 2, 1, 0}));
  ShardLayout const empty = ShardLayout::of({5, 8}, 3, 4);
  EXPECT_EQ(empty.begin, 5);
  EXPECT_EQ(empty.local_numel(), 0);
  EXPECT_EQ(empty.padded_numel(), 16);
  EXPECT_EQ(parallel::local_shape({5, 8}, empty), (std::vector<std::int64_t>{0, 8}));
}

TEST(ShardLayout, RefusesAScalarANegativeDimensionAndARankOutsideTheWorld) {
  EXPECT_THROW(ShardLayout::of({}, 0, 1), std::invalid_argument);
  EXPECT_THROW(ShardLayout::of({4, -1}, 0, 1), std::invalid_argument);
  EXPECT_THROW(ShardLayout::of({4}, 2, 2), std::invalid_argument);
  EXPECT_THROW(ShardLayout::of({4}, 0, 0), std::invalid_argument);
}

TEST(DistEnv, WithoutWorldSizeTheProcessRunsAlone) {
  DistEnv const d = DistEnv::from_map({});
  EXPECT_FALSE(d.launched);
  EXPECT_EQ(d.world_size, 1);
  EXPECT_EQ(d.rank, 0);
}

TEST(DistEnv, ReadsTorchrunsVariables) {
  DistEnv const d = DistEnv::from_map({{"RANK", "3"},
                                       {"WORLD_SIZE", "4"},
                                       {"LOCAL_RANK", "1"},
                                       {"LOCAL_WORLD_SIZE", "2"},
                                       {"MASTER_ADDR", "10.1.2.3"},
                                       {"MASTER_PORT", "29501"},
                                       {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                       {"TORCHELASTIC_RESTART_COUNT", "2"}});
  EXPECT_TRUE(d.launched);
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.world_size, 4);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.local_world_size, 2);
  EXPECT_EQ(d.master_addr, "10.1.2.3");
  EXPECT_EQ(d.master_port, 29501);
  EXPECT_TRUE(d.use_agent_store);
  EXPECT_EQ(d.restart_count, 2);
  EXPECT_NE(d.describe().find("rank 3 of 4"), std::string::npos) << d.describe();
}

TEST(DistEnv, RefusesInconsistentVariablesNamingThem) {
  auto message = [](std::map<std::string, std::string> const& env) {
    try {
      DistEnv::from_map(env);
    } catch (std::invalid_argument const& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("RANK=2 is outside WORLD_SIZE=2"), std::string::npos);
  EXPECT_NE(message({{"RANK", "0"}}).find("WORLD_SIZE is not"), std::string::npos);
  EXPECT_NE(message({{"WORLD_SIZE", "two"}}).find("WORLD_SIZE='two'"), std::string::npos);
  EXPECT_NE(message({{"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}).find("MASTER_PORT=70000"), std::string::npos);
  EXPECT_NE(message({{"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}).find("LOCAL_RANK=2"),
            std::string::npos);
}

}  // namespace
}  // namespace fusepack::test
