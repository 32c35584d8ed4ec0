// The server of a CUDA build (MORSERVE_CUDA with the CUDA model runner linked) keeps its
// /metrics listener. Regression test for issue 4's "null context when constructing
// CivetServer": a linked libcublasLt.so.13 (92 KiB of static TLS) left no room in civetweb's
// 100 KiB thread stacks, so `morserve serve` died before binding. Here the real server runs
// with `--device cpu` and is scraped; the binary is checked to hold the runner but not to
// need libcublasLt at startup (engine/cuda/cublaslt_loader.cc loads it with dlopen); and the
// old state (libcublasLt preloaded) must end with an error that names the cause.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/engine_harness.h"
#include "tests/server/server_process.h"
#include "tests/server/test_models.h"
#include "tests/testutil.h"

namespace morserve::testing {
namespace {

std::string WriteModel(const TempDir& dir) {
  const std::string path = dir.File("model");
  EXPECT_TRUE(WriteTinyModel(ServingSpec("mor-ec"), path).ok());
  return path;
}

TEST(ServerCudaBuildTest, BinaryHasTheRunnerButDoesNotLinkCublasLt) {
  const CommandResult needed = RunCommand("readelf -dW " + MorserveBinary());
  ASSERT_EQ(needed.exit_code, 0) << needed.output;
  EXPECT_NE(needed.output.find("[libcudart.so."), std::string::npos) << needed.output;
  EXPECT_EQ(needed.output.find("libcublas"), std::string::npos)
      << "libcublasLt must be loaded with dlopen, not linked:\n" << needed.output;
  // Nothing in the startup closure pulls it in either.
  const CommandResult ldd = RunCommand("ldd " + MorserveBinary());
  ASSERT_EQ(ldd.exit_code, 0) << ldd.output;
  EXPECT_EQ(ldd.output.find("libcublas"), std::string::npos) << ldd.output;

  // The runner is in: `--device cuda` reaches CreateCudaModelRunner (on a machine without a
  // GPU it reports the missing device, never "this build has no CUDA backend").
  TempDir dir;
  const std::string model = WriteModel(dir);
  const CommandResult cuda = RunCommand(MorserveBinary() + " generate --model " + model +
                                        " --prompt-ids 1,2,3 --max-tokens 2 --device cuda");
  EXPECT_EQ(cuda.output.find("no CUDA backend"), std::string::npos) << cuda.output;
  EXPECT_NE(cuda.output.find("--device cuda"), std::string::npos) << cuda.output;
}

TEST(ServerCudaBuildTest, ServesMetricsWithDeviceCpu) {
  TempDir dir;
  const std::string model = WriteModel(dir);
  ServerProcess server;
  ASSERT_TRUE(server.Start(model, {"--device", "cpu"})) << server.output();
  ASSERT_TRUE(server.WaitHealth(true)) << server.output();
  ASSERT_GT(server.metrics_port(), 0);

  auto stub = server.Stub();
  StreamResult r = GenerateAll(stub.get(), TokenRequest({1, 2, 3, 4}, 7));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.tokens.size(), 7u);

  auto text = HttpGet(server.metrics_port(), "/metrics");
  ASSERT_TRUE(text.has_value()) << server.output();
  EXPECT_EQ(ScrapeValue(*text, "morserve_generation_tokens_total"), 7);
  EXPECT_EQ(ScrapeValue(*text, "morserve_prompt_tokens_total"), 4);
  EXPECT_EQ(ScrapeValue(*text, "morserve_time_to_first_token_seconds_count"), 1);
  EXPECT_EQ(server.Terminate(), 0) << server.output();
}

// The old state on purpose: libcublasLt in the startup set. The server must refuse with a
// message naming civetweb's stacks and static TLS, not only civetweb's "binding to port".
TEST(ServerCudaBuildTest, PreloadedCublasLtGetsAnErrorNamingTheCause) {
  const std::string lib = std::string(MORSERVE_CUDA_LIBRARY_DIR) + "/libcublasLt.so";
  TempDir dir;
  const std::string model = WriteModel(dir);
  const CommandResult r = RunCommand("LD_PRELOAD=" + lib + " timeout 60 " + MorserveBinary() +
                                     " serve --model " + model +
                                     " --host 127.0.0.1 --port 0 --metrics-port 0");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("listening on"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--metrics-port: cannot listen"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("civetweb's 100 KiB thread stacks cannot hold this process's static TLS"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace morserve::testing
