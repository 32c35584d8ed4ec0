// Backend choice and health checking (see backend_pool.h).
#include "server/gateway/backend_pool.h"

#include <chrono>
#include <ctime>
#include <filesystem>

namespace morserve::gateway {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

std::string Basename(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return std::filesystem::path(dir).filename().string();
}

}  // namespace

BackendPool::BackendPool(const std::vector<std::string>& addresses, std::string served_model_name,
                         GatewayMetrics* metrics) {
  for (const std::string& a : addresses) {
    auto b = std::make_unique<Backend>();
    b->address = a;
    grpc::ChannelArguments args;
    // Reconnect quickly after a backend restarts (the default backoff grows to 120 s).
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    b->channel = grpc::CreateCustomChannel(a, grpc::InsecureChannelCredentials(), args);
    b->stub = v1::Morserve::NewStub(b->channel);
    b->health = grpc::health::v1::Health::NewStub(b->channel);
    b->outstanding_gauge = &metrics->BackendOutstanding(a);
    b->up_gauge = &metrics->BackendUp(a);
    backends_.push_back(std::move(b));
  }
  name_fixed_ = !served_model_name.empty();
  model_.name = std::move(served_model_name);
}

BackendPool::~BackendPool() { Stop(); }

void BackendPool::Start(int interval_ms) {
  for (auto& b : backends_) CheckOne(b.get());
  health_thread_ = std::thread([this, interval_ms] { HealthLoop(interval_ms); });
}

void BackendPool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (health_thread_.joinable()) health_thread_.join();
}

void BackendPool::HealthLoop(int interval_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(interval_ms), [this] { return stop_; })) {
    lock.unlock();
    for (auto& b : backends_) CheckOne(b.get());
    lock.lock();
  }
}

void BackendPool::CheckOne(Backend* b) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1000));
  HealthCheckResponse resp;
  const grpc::Status s = b->health->Check(&ctx, HealthCheckRequest(), &resp);
  const bool serving = s.ok() && resp.status() == HealthCheckResponse::SERVING;
  if (serving) {
    bool need_info;
    {
      std::lock_guard<std::mutex> lock(mu_);
      need_info = model_.context_length == 0;
    }
    if (need_info) {
      grpc::ClientContext ictx;
      ictx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1000));
      v1::ModelInfo info;
      if (!b->stub->GetModelInfo(&ictx, v1::GetModelInfoRequest(), &info).ok()) return;
      std::lock_guard<std::mutex> lock(mu_);
      if (!name_fixed_) model_.name = Basename(info.model_dir());
      model_.context_length = info.context_length();
      model_.created = static_cast<int64_t>(std::time(nullptr));
    }
  }
  SetServing(b, serving);
}

void BackendPool::SetServing(Backend* b, bool serving) {
  b->serving.store(serving);
  b->up_gauge->Set(serving ? 1 : 0);
}

Backend* BackendPool::Acquire(const Backend* exclude) {
  const size_t n = backends_.size();
  const size_t start = turn_.fetch_add(1) % n;
  Backend* best = nullptr;
  int best_load = 0;
  for (size_t k = 0; k < n; ++k) {
    Backend* b = backends_[(start + k) % n].get();
    if (b == exclude || !b->serving.load()) continue;
    const int load = b->outstanding.load();
    if (best == nullptr || load < best_load) {
      best = b;
      best_load = load;
    }
  }
  if (best != nullptr) {
    best->outstanding.fetch_add(1);
    best->outstanding_gauge->Increment();
  }
  return best;
}

void BackendPool::Release(Backend* b) {
  b->outstanding.fetch_sub(1);
  b->outstanding_gauge->Decrement();
}

void BackendPool::MarkDown(Backend* b) { SetServing(b, false); }

bool BackendPool::AnyServing() const {
  for (const auto& b : backends_) {
    if (b->serving.load()) return true;
  }
  return false;
}

ServedModel BackendPool::model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return model_;
}

}  // namespace morserve::gateway
