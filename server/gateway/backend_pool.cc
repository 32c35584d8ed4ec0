// Backend choice, health checking and the changing backend set (see backend_pool.h).
#include "server/gateway/backend_pool.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <set>

namespace morserve::gateway {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

std::string Basename(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return std::filesystem::path(dir).filename().string();
}

}  // namespace

BackendPool::BackendPool(std::string served_model_name, GatewayMetrics* metrics)
    : metrics_(metrics) {
  name_fixed_ = !served_model_name.empty();
  model_.name = std::move(served_model_name);
}

BackendPool::~BackendPool() { Stop(); }

BackendRef BackendPool::MakeBackend(const std::string& address) {
  auto b = std::make_shared<Backend>();
  b->address = address;
  grpc::ChannelArguments args;
  // Reconnect quickly after a backend restarts (the default backoff grows to 120 s).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  b->channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  b->stub = v1::Morserve::NewStub(b->channel);
  b->health = grpc::health::v1::Health::NewStub(b->channel);
  b->outstanding_gauge = &metrics_->BackendOutstanding(address);
  b->up_gauge = &metrics_->BackendUp(address);
  b->up_gauge->Set(0);
  return b;
}

std::pair<int, int> BackendPool::SetAddresses(const std::vector<std::string>& addresses) {
  DropDrained();
  const std::set<std::string> wanted(addresses.begin(), addresses.end());
  std::unique_lock<std::mutex> lock(mu_);
  int added = 0, removed = 0;
  // Drain the ones no longer wanted.
  for (auto it = backends_.begin(); it != backends_.end();) {
    if (wanted.count((*it)->address) > 0) {
      ++it;
      continue;
    }
    (*it)->draining = true;
    draining_.push_back(std::move(*it));
    it = backends_.erase(it);
    ++removed;
  }
  for (const std::string& a : wanted) {
    auto in = [&a](const BackendRef& b) { return b->address == a; };
    if (std::any_of(backends_.begin(), backends_.end(), in)) continue;
    auto d = std::find_if(draining_.begin(), draining_.end(), in);
    if (d != draining_.end()) {  // back before it drained: keep its channel and counts
      (*d)->draining = false;
      backends_.push_back(std::move(*d));
      draining_.erase(d);
    } else {
      backends_.push_back(MakeBackend(a));
    }
    ++added;
  }
  if (added > 0) {
    check_now_ = true;
    lock.unlock();
    cv_.notify_all();
  }
  return {added, removed};
}

void BackendPool::Start(int interval_ms) {
  HealthRound();
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
  for (;;) {
    cv_.wait_for(lock, std::chrono::milliseconds(interval_ms),
                 [this] { return stop_ || check_now_; });
    if (stop_) return;
    check_now_ = false;
    lock.unlock();
    HealthRound();
    lock.lock();
  }
}

void BackendPool::HealthRound() {
  DropDrained();
  std::vector<BackendRef> snapshot;
  {
    std::lock_guard<std::mutex> lock(mu_);
    snapshot = backends_;
  }
  for (const BackendRef& b : snapshot) CheckOne(b.get());
}

// Draining entries without calls leave the pool and the metrics.
void BackendPool::DropDrained() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = draining_.begin(); it != draining_.end();) {
    Backend& b = **it;
    if (b.outstanding.load() > 0) {
      ++it;
      continue;
    }
    b.dropped = true;
    b.serving.store(false);
    metrics_->RemoveBackend(b.outstanding_gauge, b.up_gauge);
    it = draining_.erase(it);
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
  std::lock_guard<std::mutex> lock(mu_);
  if (b->dropped) return;
  b->serving.store(serving);
  b->up_gauge->Set(serving ? 1 : 0);
}

BackendRef BackendPool::Acquire(const Backend* exclude) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = backends_.size();
  if (n == 0) return nullptr;
  const size_t start = turn_++ % n;
  BackendRef best;
  int best_load = 0;
  for (size_t k = 0; k < n; ++k) {
    const BackendRef& b = backends_[(start + k) % n];
    if (b.get() == exclude || !b->serving.load()) continue;
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
  std::lock_guard<std::mutex> lock(mu_);  // against DropDrained removing the gauge
  b->outstanding.fetch_sub(1);
  b->outstanding_gauge->Decrement();
}

void BackendPool::MarkDown(Backend* b) { SetServing(b, false); }

bool BackendPool::AnyServing() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& b : backends_) {
    if (b->serving.load()) return true;
  }
  return false;
}

size_t BackendPool::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return backends_.size();
}

ServedModel BackendPool::model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return model_;
}

}  // namespace morserve::gateway
