// Tiled VAE decode (issue 47, "Big images"): AutoencoderKL::tiledDecode against diffusers'
// AutoencoderKL / AutoencoderKLFlux2 tiled_decode (enable_tiling() with 32 px tiles, goldens in
// tests/data/vae-tiling, made in the golden lab by make_vae_tiling_goldens.py), the untiled path
// unchanged, and the tiles shared out over the ranks of MPI_COMM_WORLD (run under mpirun -np 2
// and -np 4) equal bit for bit to the one-rank tiled decode.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/io/safetensors.h"
#include "backend/io/tensor_io.h"
#include "backend/io/weight_source.h"
#include "backend/models/autoencoders/autoencoder_kl.h"
#include "backend/pipelines/flux/pipeline_flux.h"
#include "parallel/process_group_mpi.h"

using namespace dit;

namespace {

const std::string kData = DITSTUDIO_TEST_DATA;

int worldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

struct Case {
  std::string name;       // golden file stem
  std::string vaeFolder;  // fixture VAE the goldens were made with
};
const Case kFlux{"flux", kData + "/tiny-flux-A/vae"};
const Case kFlux2{"flux2", kData + "/tiny-flux2-A/vae"};

AutoencoderKLConfig loadConfig(const std::string& folder) {
  const std::string f = folder + "/config.json";
  std::ifstream in(f);
  return parseAutoencoderKLConfig(nlohmann::json::parse(in), f);
}

std::unique_ptr<AutoencoderKL> loadVae(const Case& c) {
  auto w = WeightSource::fromFolder(c.vaeFolder, "diffusion_pytorch_model", at::kFloat,
                                    c10::Device(c10::kCPU));
  return std::make_unique<AutoencoderKL>(loadConfig(c.vaeFolder), *w);
}

// The goldens' tiling: tile_sample_min_size 32, tile_latent_min_size 32 / vae_scale_factor.
VaeTiling goldenTiling(const AutoencoderKL& vae) {
  VaeTiling t;
  t.enabled = true;
  t.tile_sample_min_size = 32;
  t.tile_latent_min_size = 32 / vae.config().vaeScaleFactor();
  t.tile_overlap_factor = 0.25;
  return t;
}

struct Goldens {
  explicit Goldens(const Case& c) : file(kData + "/vae-tiling/" + c.name + ".safetensors") {}
  at::Tensor get(const std::string& n) const { return loadTensor(file, n, at::kFloat); }
  SafetensorsCollection file;
};

double maxAbs(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

void checkAgainstDiffusers(const Case& c) {
  at::NoGradGuard ng;
  auto vae = loadVae(c);
  Goldens g(c);
  for (int k = 0; k < 2; ++k) {
    const std::string s = std::to_string(k);
    const at::Tensor z = g.get("latents_" + s), tiledRef = g.get("tiled_" + s),
                     untiledRef = g.get("untiled_" + s);
    vae->setTiling(goldenTiling(*vae));
    const auto grid = vae->tileGrid(z.size(2), z.size(3));
    ASSERT_GT(grid.count(), 4) << "the case must cross several tiles";
    const at::Tensor tiled = vae->decode(z);
    VaeTiling off = vae->tiling();
    off.enabled = false;
    vae->setTiling(off);
    const at::Tensor untiled = vae->decode(z);
    ASSERT_EQ(tiled.sizes(), tiledRef.sizes());
    ASSERT_EQ(untiled.sizes(), untiledRef.sizes());
    const double dT = maxAbs(tiled, tiledRef), dU = maxAbs(untiled, untiledRef),
                 dTU = maxAbs(tiledRef, untiledRef);
    std::printf(
        "%s case %d: latents %lldx%lld, %lld tiles (%lld x %lld); tiled vs diffusers %.3g, "
        "untiled vs diffusers %.3g, diffusers tiled vs untiled %.3g\n",
        c.name.c_str(), k, static_cast<long long>(z.size(2)), static_cast<long long>(z.size(3)),
        static_cast<long long>(grid.count()), static_cast<long long>(grid.rows()),
        static_cast<long long>(grid.cols()), dT, dU, dTU);
    EXPECT_LT(dT, 1e-5) << c.name << " case " << k;
    EXPECT_LT(dU, 1e-5) << c.name << " case " << k;
    EXPECT_GT(dTU, 0.1) << "tiling must change the image, or the comparison proves nothing";
    EXPECT_GT(maxAbs(tiled, untiled), 0.1);
    // tiledDecode ignores `enabled` and uses the same sizes.
    EXPECT_TRUE(at::equal(vae->tiledDecode(z), tiled));
  }
}

TEST(VaeTiling, FluxTiledDecodeMatchesDiffusers) { checkAgainstDiffusers(kFlux); }
// AutoencoderKLFlux2: post_quant_conv on every tile, vae_scale_factor 4.
TEST(VaeTiling, Flux2TiledDecodeMatchesDiffusers) { checkAgainstDiffusers(kFlux2); }

// diffusers' _tiled_encode (tiles of 32 px every 24, moments blended over int(tile_latent / 4)
// cells) and the untiled encode, through encode() with tiling on and off.
void checkEncodeAgainstDiffusers(const Case& c) {
  at::NoGradGuard ng;
  auto vae = loadVae(c);
  ASSERT_TRUE(vae->hasEncoder());
  Goldens g(c);
  for (int k = 0; k < 2; ++k) {
    const std::string s = std::to_string(k);
    const at::Tensor x = g.get("enc_image_" + s);
    vae->setTiling(goldenTiling(*vae));
    const auto tiled = vae->encode(x);
    VaeTiling off = vae->tiling();
    off.enabled = false;
    vae->setTiling(off);
    const auto untiled = vae->encode(x);
    const at::Tensor tm = g.get("enc_tiled_mean_" + s), tl = g.get("enc_tiled_logvar_" + s);
    ASSERT_EQ(tiled.mean.sizes(), tm.sizes());
    const double dM = maxAbs(tiled.mean, tm), dL = maxAbs(tiled.logvar, tl),
                 dU = std::max(maxAbs(untiled.mean, g.get("enc_untiled_mean_" + s)),
                               maxAbs(untiled.logvar, g.get("enc_untiled_logvar_" + s))),
                 dTU = maxAbs(tm, g.get("enc_untiled_mean_" + s));
    std::printf(
        "%s encode case %d: image %lldx%lld; tiled mean %.3g, logvar %.3g vs diffusers; "
        "untiled %.3g; diffusers tiled vs untiled mean %.3g\n",
        c.name.c_str(), k, static_cast<long long>(x.size(2)), static_cast<long long>(x.size(3)), dM,
        dL, dU, dTU);
    EXPECT_LT(dM, 1e-5) << c.name << " case " << k;
    EXPECT_LT(dL, 1e-5) << c.name << " case " << k;
    EXPECT_LT(dU, 1e-5) << c.name << " case " << k;
    EXPECT_GT(dTU, 0.1);
  }
}

TEST(VaeTiling, FluxTiledEncodeMatchesDiffusers) { checkEncodeAgainstDiffusers(kFlux); }
TEST(VaeTiling, Flux2TiledEncodeMatchesDiffusers) { checkEncodeAgainstDiffusers(kFlux2); }

TEST(VaeTiling, DefaultSizesFollowSampleSize) {
  const auto cfg = loadConfig(kFlux.vaeFolder);
  EXPECT_EQ(cfg.sample_size, 32);
  VaeTiling t;  // every size 0: the config's, as diffusers' __init__
  const auto g = makeVaeTileGrid(cfg, t, 34, 50);
  EXPECT_EQ(g.tile_sample, 32);
  EXPECT_EQ(g.tile_latent, 16);  // int(32 / 2)
  EXPECT_EQ(g.stride, 12);       // int(16 * 0.75)
  EXPECT_EQ(g.blend_extent, 8);  // int(32 * 0.25)
  EXPECT_EQ(g.row_limit, 24);
  EXPECT_EQ(g.row_starts, (std::vector<int64_t>{0, 12, 24}));
  EXPECT_EQ(g.col_starts, (std::vector<int64_t>{0, 12, 24, 36, 48}));
  const auto c2 = loadConfig(kFlux2.vaeFolder);
  EXPECT_EQ(makeVaeTileGrid(c2, t, 8, 8).tile_latent, 8);  // 32 / vae_scale_factor 4
  // AutoencoderKLFlux2 without sample_size: its constructor default 1024.
  auto j = nlohmann::json::parse(std::ifstream(kFlux2.vaeFolder + "/config.json"));
  j.erase("sample_size");
  EXPECT_EQ(parseAutoencoderKLConfig(j, "x").sample_size, 1024);
  j["sample_size"] = {64, 64};
  EXPECT_EQ(parseAutoencoderKLConfig(j, "x").sample_size, 64);
}

TEST(VaeTiling, BadSizesThrow) {
  const auto cfg = loadConfig(kFlux.vaeFolder);
  VaeTiling t;
  t.tile_overlap_factor = 1.0;
  EXPECT_THROW(makeVaeTileGrid(cfg, t, 32, 32), std::invalid_argument);
  t.tile_overlap_factor = 0.25;
  t.tile_latent_min_size = 1;  // stride int(0.75) = 0: diffusers' range() would not advance
  EXPECT_THROW(makeVaeTileGrid(cfg, t, 32, 32), std::invalid_argument);
  t.tile_latent_min_size = -2;
  EXPECT_THROW(makeVaeTileGrid(cfg, t, 32, 32), std::invalid_argument);
}

TEST(VaeTiling, SmallLatentIsNotTiled) {
  at::NoGradGuard ng;
  auto vae = loadVae(kFlux);
  const at::Tensor z = Goldens(kFlux).get("latents_0").narrow(2, 0, 16).narrow(3, 0, 16);
  const at::Tensor plain = vae->decode(z);
  vae->setTiling(goldenTiling(*vae));
  EXPECT_TRUE(at::equal(vae->decode(z), plain));  // 16 <= tile_latent_min_size: one piece
}

PipelineInputs smallRequest() {
  PipelineInputs p;
  p.prompt = "a red circle";
  p.seed = 7;
  p.width = 96;  // latent 48 x 32 at vae_scale_factor 2: 4 x 3 tiles of 16
  p.height = 64;
  p.steps = 2;
  return p;
}

VaeTiling tiling32() {
  VaeTiling t;
  t.enabled = true;
  t.tile_sample_min_size = 32;  // tile_latent_min_size: int(32 / 2)
  return t;
}

// PipelineOptions::vae_tiling reaches the FLUX.1 pipeline's decode: generate()'s image is the
// tiled decode of its final latents, and differs from the untiled one.
TEST(VaeTiling, FluxPipelineDecodesInTiles) {
  at::NoGradGuard ng;
  const auto model = ModelFolder::open(kData + "/tiny-flux-A");
  PipelineOptions po;
  po.vae_tiling = tiling32();
  FluxPipeline tiled(model, po);
  FluxPipeline plain(model, PipelineOptions{});
  const PipelineInputs p = smallRequest();
  const auto res = tiled.generate(p);
  const at::Tensor untiled = plain.decode(res.final_latents, p.height, p.width);
  EXPECT_TRUE(at::equal(res.image, tiled.decode(res.final_latents, p.height, p.width)));
  const double d = maxAbs(res.image, untiled);
  std::printf("FLUX.1 pipeline 96x64: tiled vs untiled image %.3g\n", d);
  EXPECT_GT(d, 0.01);
  PipelineOptions bad;
  bad.vae_tiling = tiling32();
  bad.vae_tiling.tile_sample_min_size = 2;  // latent tile 1, stride 0: refused at load
  EXPECT_THROW(FluxPipeline(model, bad), std::invalid_argument);
}

// Under mpirun: each rank decodes its share of the tiles, rank 0 blends and broadcasts.
TEST(VaeTilingRanks, SplitEqualsOneRankExactly) {
  at::NoGradGuard ng;
  auto group = std::make_shared<ProcessGroupMPI>(MPI_COMM_WORLD, "world");
  for (const Case& c : {kFlux, kFlux2}) {
    auto vae = loadVae(c);
    vae->setTiling(goldenTiling(*vae));
    Goldens g(c);
    for (int k = 0; k < 2; ++k) {
      const at::Tensor z = g.get("latents_" + std::to_string(k));
      const at::Tensor one = vae->tiledDecode(z);
      const at::Tensor split = vae->decode(z, group.get());
      ASSERT_EQ(split.sizes(), one.sizes());
      const double d = maxAbs(split, one);
      if (worldRank() == 0)
        std::printf("%s case %d over %d ranks: max |split - one rank| = %.3g, vs diffusers %.3g\n",
                    c.name.c_str(), k, group->size(), d,
                    maxAbs(split, g.get("tiled_" + std::to_string(k))));
      EXPECT_TRUE(at::equal(split, one)) << c.name << " case " << k << " rank " << worldRank();
    }
  }
}

// generate()'s final decode shares the tiles over PipelineOptions::vae_decode (here the world:
// every rank runs the same one-rank pipeline), equal to the local tiled decode bit for bit.
TEST(VaeTilingRanks, FluxPipelineFinalDecodeOverTheGroup) {
  at::NoGradGuard ng;
  PipelineOptions po;
  po.vae_tiling = tiling32();
  po.vae_decode = std::make_shared<ProcessGroupMPI>(MPI_COMM_WORLD, "world");
  FluxPipeline pipe(ModelFolder::open(kData + "/tiny-flux-A"), po);
  const PipelineInputs p = smallRequest();
  const auto res = pipe.generate(p);
  const at::Tensor local = pipe.decode(res.final_latents, p.height, p.width);  // not collective
  EXPECT_TRUE(at::equal(res.image, local)) << "rank " << worldRank();
  EXPECT_GT(po.vae_decode->bytesSent(), 0u);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (worldRank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
