// The `--device cuda` half of issue 4's metrics fix, in one process without needing a GPU:
// prometheus-cpp's Exposer (civetweb) keeps serving after engine/cuda/cublaslt_loader loads
// cuBLASLt (as the CUDA runner does when it creates its GEMM handle, after `morserve serve`
// started /metrics), and an Exposer started after the load works too. Also checks the
// condition itself (a thread with civetweb's 102400-byte stack can still be created) and that
// the forwarders reach the real library.
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <pthread.h>

#include <memory>
#include <string>

#include <cublasLt.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include "engine/cuda/cublaslt_loader.h"
#include "tests/server/server_process.h"

namespace morserve::testing {
namespace {

int CreateThreadWithStack(size_t bytes) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, bytes);
  pthread_t thread;
  const int rc = pthread_create(&thread, &attr, [](void*) -> void* { return nullptr; }, nullptr);
  pthread_attr_destroy(&attr);
  if (rc == 0) pthread_join(thread, nullptr);
  return rc;
}

struct Metrics {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  int port = 0;
};

// An Exposer on 127.0.0.1 port 0 with one counter at `value`.
std::unique_ptr<Metrics> StartMetrics(const char* name, double value) {
  auto m = std::make_unique<Metrics>();
  m->exposer = std::make_unique<prometheus::Exposer>("127.0.0.1:0");
  prometheus::BuildCounter().Name(name).Help("test").Register(*m->registry).Add({}).Increment(value);
  m->exposer->RegisterCollectable(m->registry);
  m->port = m->exposer->GetListeningPorts().at(0);
  return m;
}

std::optional<double> Scrape(const Metrics& m, const std::string& series) {
  auto text = HttpGet(m.port, "/metrics");
  if (!text) return std::nullopt;
  return ScrapeValue(*text, series);
}

TEST(MetricsCublasLtTest, ExposersServeBeforeAndAfterTheLoad) {
  // Not loaded at startup: the test binary does not link libcublasLt either.
  ASSERT_FALSE(cuda::CublasLtLoaded());
  EXPECT_EQ(dlopen(cuda::CublasLtSoname(), RTLD_NOW | RTLD_NOLOAD), nullptr);
  auto before = StartMetrics("before_load_total", 3);
  EXPECT_EQ(Scrape(*before, "before_load_total"), 3);

  const std::string& error = cuda::LoadCublasLt();
  ASSERT_EQ(error, "") << error;
  EXPECT_TRUE(cuda::CublasLtLoaded());
  void* self = dlopen(cuda::CublasLtSoname(), RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(self, nullptr) << "the library is in the process now";
  if (self != nullptr) dlclose(self);  // drops only the NOLOAD reference
  // The forwarders reach it: its version, and its init code runs (a handle with a GPU;
  // CUBLAS_STATUS_NOT_INITIALIZED without one).
  EXPECT_EQ(cublasLtGetVersion() / 10000, static_cast<size_t>(CUBLAS_VER_MAJOR));
  cublasLtHandle_t handle = nullptr;
  const cublasStatus_t st = cublasLtCreate(&handle);
  EXPECT_TRUE(st == CUBLAS_STATUS_SUCCESS || st == CUBLAS_STATUS_NOT_INITIALIZED)
      << cublasLtGetStatusString(st);
  if (st == CUBLAS_STATUS_SUCCESS) EXPECT_EQ(cublasLtDestroy(handle), CUBLAS_STATUS_SUCCESS);
  EXPECT_STRNE(cublasLtGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED), "");

  // civetweb's thread stacks still fit, so both listeners work.
  EXPECT_EQ(CreateThreadWithStack(102400), 0);
  EXPECT_EQ(Scrape(*before, "before_load_total"), 3);
  auto after = StartMetrics("after_load_total", 5);
  EXPECT_EQ(Scrape(*after, "after_load_total"), 5);
  EXPECT_EQ(Scrape(*before, "before_load_total"), 3);
  EXPECT_EQ(cuda::LoadCublasLt(), "") << "a second call gives the first answer";
}

}  // namespace
}  // namespace morserve::testing
