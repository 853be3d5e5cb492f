// The CUDA conv family's host-side planning (runtime/cuda/conv_plan.h): the pad split, the algorithm choice among
// cudnnFind*'s measurements and the cache that measures once per key. CPU only: runs in every build.
#include "runtime/cuda/conv_plan.h"

#include <gtest/gtest.h>

namespace apart::cuda {
namespace {

ConvAlgoKey resnet_stem() {
  return ConvAlgoKey{ConvDirection::kForward, 0, 0, 3, {8, 3, 224, 224}, {64, 3, 7, 7}, {3, 3}, {2, 2}, {1, 1}, 1};
}

TEST(ConvPlan, SymmetricPadsGoToCudnnWholeAndNeedNoBorder) {
  const ConvPadding p = split_pads({3, 1}, {3, 1});
  EXPECT_EQ(p.symmetric, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(p.extra_begin, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(p.extra_end, (std::vector<int64_t>{0, 0}));
  EXPECT_FALSE(p.needs_border());
}

TEST(ConvPlan, AsymmetricPadsKeepTheCommonPartAndBorderTheRest) {
  // SAME_UPPER with a 2x2 kernel and stride 2 on odd sizes pads (0, 1); explicit pads may lean either way.
  const ConvPadding p = split_pads({0, 2, 1}, {1, 0, 1});
  EXPECT_EQ(p.symmetric, (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(p.extra_begin, (std::vector<int64_t>{0, 2, 0}));
  EXPECT_EQ(p.extra_end, (std::vector<int64_t>{1, 0, 0}));
  EXPECT_TRUE(p.needs_border());
}

TEST(ConvPlan, KeysDifferInEveryFieldTheFindDependsOn) {
  const ConvAlgoKey base = resnet_stem();
  EXPECT_EQ(base, resnet_stem());
  std::vector<ConvAlgoKey> variants(10, base);
  variants[0].direction = ConvDirection::kBackwardFilter;
  variants[1].device = 1;
  variants[2].data_type = 1;
  variants[3].math = 0;
  variants[4].x[0] = 16;
  variants[5].w[1] = 1;
  variants[6].pads = {2, 3};
  variants[7].strides = {1, 2};
  variants[8].dilations = {2, 2};
  variants[9].group = 3;
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_NE(variants[i], base) << "variant " << i;
    EXPECT_TRUE(variants[i] < base || base < variants[i]) << "variant " << i << " orders equal to the base";
  }
}

TEST(ConvPlan, KeyDescriptionNamesTheDirectionAndTheShapes) {
  ConvAlgoKey key = resnet_stem();
  key.direction = ConvDirection::kBackwardData;
  EXPECT_EQ(key.describe(),
            "backward-data x=[8,3,224,224] w=[64,3,7,7] pads=[3,3] strides=[2,2] dilations=[1,1] group=1 dtype=0 "
            "math=3 device 0");
}

TEST(ConvPlan, ChoiceIsTheFastestDeterministicAlgorithmThatRanAndFits) {
  const std::vector<ConvAlgoCandidate> candidates{
      {0, true, 0.5f, 0, false, 3},        // fastest, but nondeterministic
      {1, true, 0.9f, 1 << 20, true, 3},   // deterministic
      {2, true, 0.7f, 1ll << 40, true, 3}, // deterministic and faster, but needs too much workspace
      {3, false, 0.1f, 0, true, 3},        // did not run
      {4, true, 1.5f, 0, true, 0},         // deterministic, slower
  };
  const auto choice = pick_conv_algo(candidates, 256ll << 20);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->algo, 1);
  EXPECT_EQ(choice->workspace_bytes, 1 << 20);
  EXPECT_EQ(choice->math, 3);
}

TEST(ConvPlan, WithoutADeterministicAlgorithmTheFastestThatRanIsChosen) {
  const std::vector<ConvAlgoCandidate> candidates{{5, true, 2.0f, 0, false, 0}, {6, true, 1.0f, 64, false, 1}};
  const auto choice = pick_conv_algo(candidates, 1024);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->algo, 6);
  EXPECT_EQ(choice->math, 1);
}

TEST(ConvPlan, NoChoiceWhenNothingRanOrFits) {
  EXPECT_FALSE(pick_conv_algo({}, 1024).has_value());
  EXPECT_FALSE(pick_conv_algo({{0, false, 1.0f, 0, true, 0}, {1, true, 1.0f, 4096, true, 0}}, 1024).has_value());
}

TEST(ConvPlan, CacheMeasuresOncePerKey) {
  ConvAlgoCache cache;
  int finds = 0;
  auto find = [&](const ConvAlgoKey& key) {
    ++finds;
    return ConvAlgoChoice{static_cast<int>(key.x[0]), 3, 128};
  };
  ConvAlgoKey a = resnet_stem(), b = resnet_stem();
  b.x[0] = 4;
  EXPECT_EQ(cache.get(a, find).algo, 8);
  EXPECT_EQ(cache.get(a, find).algo, 8);
  EXPECT_EQ(finds, 1);
  EXPECT_EQ(cache.get(b, find).algo, 4);
  EXPECT_EQ(finds, 2);
  EXPECT_EQ(cache.get(a, find).workspace_bytes, 128);
  EXPECT_EQ(finds, 2);
  EXPECT_EQ(cache.size(), 2u);
}

}  // namespace
}  // namespace apart::cuda
