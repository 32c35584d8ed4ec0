// The Kubernetes manifests: `kubectl kustomize` renders the base and the GPU overlay (with
// kubectl 1.20's built-in kustomize v2.0 as Debian ships it, and with current ones), kubectl
// decodes each built-in object into its typed Go struct offline (`kubectl set env --local`:
// wrong field types fail; unknown fields and CRDs are not checked by it), and C++ checks what
// a schema cannot: required fields per kind and the references between objects (selectors
// match pod labels, named ports exist, ConfigMaps and claims exist, every $(VAR) in args
// comes from the ConfigMap, probes hit the container's ports). The GPU overlay requests and
// limits one nvidia.com/gpu and runs the gpu image. There is no API server here, so
// server-side validation (admission, OpenAPI schema of CRDs) is not exercised.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "tests/deploy/deploy_testutil.h"
#include "tests/testutil.h"
#include "yaml-cpp/yaml.h"

namespace morserve::testing {
namespace {

struct Rendered {
  std::vector<YAML::Node> objects;
  std::vector<std::string> texts;  // each object as kustomize wrote it
  std::string error;
  std::vector<YAML::Node> OfKind(const std::string& kind) const {
    std::vector<YAML::Node> out;
    for (const auto& o : objects) {
      if (o["kind"].as<std::string>() == kind) out.push_back(o);
    }
    return out;
  }
  YAML::Node Named(const std::string& kind, const std::string& name) const {
    for (const auto& o : OfKind(kind)) {
      if (o["metadata"]["name"].as<std::string>() == name) return o;
    }
    return YAML::Node();
  }
};

Rendered Render(const std::string& dir) {
  Rendered r;
  const ShellResult k = RunShell("kubectl kustomize " + ShellQuote(RepoPath(dir)));
  if (k.rc != 0) {
    r.error = "kubectl kustomize " + dir + " failed: " + k.err;
    return r;
  }
  std::stringstream in(k.out);
  std::string doc;
  const auto flush = [&] {
    const YAML::Node n = YAML::Load(doc);
    if (n.IsMap()) {
      r.objects.push_back(n);
      r.texts.push_back(doc);
    }
    doc.clear();
  };
  for (std::string line; std::getline(in, line);) {
    if (line == "---") {
      flush();
    } else {
      doc += line + "\n";
    }
  }
  flush();
  return r;
}

std::string S(const YAML::Node& n) { return n ? n.as<std::string>() : ""; }

std::map<std::string, std::string> Labels(const YAML::Node& n) {
  std::map<std::string, std::string> m;
  if (n) {
    for (const auto& e : n) m[e.first.as<std::string>()] = e.second.as<std::string>();
  }
  return m;
}

bool Selects(const std::map<std::string, std::string>& selector,
             const std::map<std::string, std::string>& labels) {
  if (selector.empty()) return false;
  for (const auto& [k, v] : selector) {
    auto it = labels.find(k);
    if (it == labels.end() || it->second != v) return false;
  }
  return true;
}

// Deployments whose pod template the selector matches.
std::vector<YAML::Node> SelectedDeployments(const Rendered& r,
                                            const std::map<std::string, std::string>& sel) {
  std::vector<YAML::Node> out;
  for (const auto& d : r.OfKind("Deployment")) {
    if (Selects(sel, Labels(d["spec"]["template"]["metadata"]["labels"]))) out.push_back(d);
  }
  return out;
}

std::set<std::string> ContainerPortNames(const YAML::Node& deployment) {
  std::set<std::string> names;
  for (const auto& c : deployment["spec"]["template"]["spec"]["containers"]) {
    for (const auto& p : c["ports"]) names.insert(S(p["name"]));
  }
  return names;
}

const std::regex kDnsName("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
const std::regex kQuantity("[0-9]+(\\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?");

void CheckCommon(const YAML::Node& o) {
  const std::string what = S(o["kind"]) + "/" + S(o["metadata"]["name"]);
  EXPECT_FALSE(S(o["apiVersion"]).empty()) << what;
  EXPECT_TRUE(std::regex_match(S(o["metadata"]["name"]), kDnsName)) << what << ": bad name";
  EXPECT_EQ(Labels(o["metadata"]["labels"])["app.kubernetes.io/name"], "morserve") << what;
}

void CheckContainer(const YAML::Node& c, const Rendered& r, const YAML::Node& pod,
                    const std::string& what) {
  EXPECT_FALSE(S(c["name"]).empty()) << what;
  EXPECT_FALSE(S(c["image"]).empty()) << what;
  std::set<int> port_numbers;
  std::set<std::string> port_names;
  for (const auto& p : c["ports"]) {
    port_numbers.insert(p["containerPort"].as<int>());
    EXPECT_LE(S(p["name"]).size(), 15u) << what << ": port names are at most 15 characters";
    EXPECT_TRUE(port_names.insert(S(p["name"])).second) << what << ": duplicate port name";
  }
  // Probes: all three, each on a port the container listens on.
  for (const char* probe : {"startupProbe", "readinessProbe", "livenessProbe"}) {
    const YAML::Node p = c[probe];
    ASSERT_TRUE(p) << what << ": no " << probe;
    if (p["grpc"]) {
      EXPECT_TRUE(port_numbers.count(p["grpc"]["port"].as<int>())) << what << " " << probe;
    } else if (p["httpGet"]) {
      const std::string port = S(p["httpGet"]["port"]);
      EXPECT_TRUE(port_names.count(port) || port_numbers.count(std::atoi(port.c_str())))
          << what << " " << probe << " port " << port;
      EXPECT_EQ(S(p["httpGet"]["path"]).rfind('/', 0), 0u) << what << " " << probe;
    } else {
      ADD_FAILURE() << what << " " << probe << ": neither grpc nor httpGet";
    }
  }
  // $(VAR) in args: from envFrom ConfigMaps (that exist) or env.
  std::set<std::string> vars;
  for (const auto& e : c["envFrom"]) {
    const YAML::Node cm = r.Named("ConfigMap", S(e["configMapRef"]["name"]));
    ASSERT_TRUE(cm) << what << ": ConfigMap " << S(e["configMapRef"]["name"]) << " not rendered";
    for (const auto& kv : cm["data"]) vars.insert(kv.first.as<std::string>());
  }
  for (const auto& e : c["env"]) vars.insert(S(e["name"]));
  std::regex ref("\\$\\(([A-Za-z_][A-Za-z0-9_]*)\\)");
  for (const auto& a : c["args"]) {
    const std::string arg = S(a);
    for (std::sregex_iterator it(arg.begin(), arg.end(), ref), end; it != end; ++it) {
      EXPECT_TRUE(vars.count((*it)[1]))
          << what << ": args use $(" << (*it)[1] << ") which nothing defines";
    }
  }
  for (const char* side : {"requests", "limits"}) {
    for (const auto& q : c["resources"][side]) {
      EXPECT_TRUE(std::regex_match(S(q.second), kQuantity))
          << what << " " << side << " " << S(q.first);
    }
  }
  // Mounts name volumes of the pod; claims exist.
  std::set<std::string> volumes;
  for (const auto& v : pod["volumes"]) {
    volumes.insert(S(v["name"]));
    if (v["persistentVolumeClaim"]) {
      EXPECT_TRUE(r.Named("PersistentVolumeClaim", S(v["persistentVolumeClaim"]["claimName"])))
          << what << ": claim " << S(v["persistentVolumeClaim"]["claimName"]) << " not rendered";
    }
  }
  for (const auto& m : c["volumeMounts"]) EXPECT_TRUE(volumes.count(S(m["name"]))) << what;
  EXPECT_FALSE(c["securityContext"]["allowPrivilegeEscalation"].as<bool>(true)) << what;
}

void CheckObjects(const Rendered& r) {
  ASSERT_EQ(r.error, "");
  std::map<std::string, int> kinds;
  for (const auto& o : r.objects) {
    CheckCommon(o);
    ++kinds[S(o["kind"])];
  }
  EXPECT_EQ(kinds, (std::map<std::string, int>{{"ConfigMap", 2},
                                               {"Deployment", 2},
                                               {"HorizontalPodAutoscaler", 1},
                                               {"PersistentVolumeClaim", 1},
                                               {"PodDisruptionBudget", 2},
                                               {"PrometheusRule", 1},
                                               {"Service", 3},
                                               {"ServiceMonitor", 2}}));
  for (const auto& d : r.OfKind("Deployment")) {
    const std::string what = "Deployment/" + S(d["metadata"]["name"]);
    EXPECT_EQ(S(d["apiVersion"]), "apps/v1");
    const auto pod_labels = Labels(d["spec"]["template"]["metadata"]["labels"]);
    EXPECT_TRUE(Selects(Labels(d["spec"]["selector"]["matchLabels"]), pod_labels)) << what;
    const YAML::Node pod = d["spec"]["template"]["spec"];
    EXPECT_TRUE(pod["securityContext"]["runAsNonRoot"].as<bool>(false)) << what;
    EXPECT_GT(pod["securityContext"]["runAsUser"].as<int>(0), 0) << what;
    ASSERT_GE(pod["containers"].size(), 1u) << what;
    for (const auto& c : pod["containers"]) CheckContainer(c, r, pod, what);
  }
  // Services select exactly one Deployment's pods, and target ports it names.
  for (const auto& s : r.OfKind("Service")) {
    const std::string what = "Service/" + S(s["metadata"]["name"]);
    const auto selected = SelectedDeployments(r, Labels(s["spec"]["selector"]));
    ASSERT_EQ(selected.size(), 1u) << what;
    const auto names = ContainerPortNames(selected[0]);
    for (const auto& p : s["spec"]["ports"]) {
      EXPECT_TRUE(names.count(S(p["targetPort"]))) << what << ": targetPort " << S(p["targetPort"]);
    }
  }
  // Server tier: gRPC probes; the gateway: GET /health for startup and readiness.
  const YAML::Node server = r.Named("Deployment", "morserve-server");
  const YAML::Node gateway = r.Named("Deployment", "morserve-gateway");
  ASSERT_TRUE(server && gateway);
  const YAML::Node sc = server["spec"]["template"]["spec"]["containers"][0];
  const YAML::Node gc = gateway["spec"]["template"]["spec"]["containers"][0];
  for (const char* probe : {"startupProbe", "readinessProbe", "livenessProbe"}) {
    EXPECT_EQ(sc[probe]["grpc"]["port"].as<int>(0), 50051) << probe;
  }
  EXPECT_EQ(S(gc["startupProbe"]["httpGet"]["path"]), "/health");
  EXPECT_EQ(S(gc["readinessProbe"]["httpGet"]["path"]), "/health");
  // The drain (SIGTERM -> NOT_SERVING -> streams finish) fits in the grace period.
  const YAML::Node flags = r.Named("ConfigMap", S(sc["envFrom"][0]["configMapRef"]["name"]));
  EXPECT_GT(server["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].as<int>(30),
            std::stoi(S(flags["data"]["MORSERVE_DRAIN_TIMEOUT"])));
  // The gateway's backend is dns:SERVICE:PORT of a headless Service (clusterIP: None) of the
  // server tier, on its gRPC port: one backend per ready server pod, re-resolved.
  const YAML::Node gflags = r.Named("ConfigMap", S(gc["envFrom"][0]["configMapRef"]["name"]));
  const std::string backend = S(gflags["data"]["MORSERVE_BACKEND"]);
  ASSERT_EQ(backend.rfind("dns:", 0), 0u) << "MORSERVE_BACKEND " << backend << " is not dns:";
  const std::string name_port = backend.substr(4);
  const YAML::Node backend_service = r.Named("Service", name_port.substr(0, name_port.find(':')));
  ASSERT_TRUE(backend_service) << "MORSERVE_BACKEND " << backend << " names no Service";
  EXPECT_EQ(S(backend_service["spec"]["clusterIP"]), "None") << "not a headless Service";
  EXPECT_EQ(S(backend_service["spec"]["selector"]["app.kubernetes.io/component"]),
            S(server["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]));
  EXPECT_EQ(S(backend_service["spec"]["ports"][0]["port"]),
            name_port.substr(name_port.find(':') + 1));
  EXPECT_EQ(S(backend_service["spec"]["ports"][0]["targetPort"]),
            S(sc["ports"][0]["name"]));  // the server's gRPC port
  EXPECT_GE(std::stoi(S(gflags["data"]["MORSERVE_RESOLVE_INTERVAL_MS"])), 1000);
  // HPA: scales the server Deployment on the per-pod queue metric.
  const YAML::Node hpa = r.OfKind("HorizontalPodAutoscaler")[0];
  EXPECT_EQ(S(hpa["apiVersion"]), "autoscaling/v2");
  EXPECT_EQ(S(hpa["spec"]["scaleTargetRef"]["kind"]), "Deployment");
  EXPECT_TRUE(r.Named("Deployment", S(hpa["spec"]["scaleTargetRef"]["name"])));
  EXPECT_LE(hpa["spec"]["minReplicas"].as<int>(), hpa["spec"]["maxReplicas"].as<int>());
  EXPECT_EQ(S(hpa["spec"]["metrics"][0]["type"]), "Pods");
  EXPECT_EQ(S(hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]), "morserve_requests_waiting");
  // PDBs: one of minAvailable / maxUnavailable, selecting one Deployment that can satisfy it.
  for (const auto& p : r.OfKind("PodDisruptionBudget")) {
    EXPECT_EQ(S(p["apiVersion"]), "policy/v1");
    EXPECT_NE(!p["spec"]["minAvailable"], !p["spec"]["maxUnavailable"]) << S(p["metadata"]["name"]);
    const auto selected = SelectedDeployments(r, Labels(p["spec"]["selector"]["matchLabels"]));
    ASSERT_EQ(selected.size(), 1u) << S(p["metadata"]["name"]);
    if (p["spec"]["minAvailable"]) {
      EXPECT_LT(p["spec"]["minAvailable"].as<int>(), selected[0]["spec"]["replicas"].as<int>(1))
          << S(p["metadata"]["name"]) << " would block every drain";
    }
  }
  // ServiceMonitors select one Service each and scrape a port it names.
  for (const auto& m : r.OfKind("ServiceMonitor")) {
    std::vector<YAML::Node> services;
    for (const auto& s : r.OfKind("Service")) {
      if (Selects(Labels(m["spec"]["selector"]["matchLabels"]), Labels(s["metadata"]["labels"]))) {
        services.push_back(s);
      }
    }
    ASSERT_EQ(services.size(), 1u) << S(m["metadata"]["name"]);
    std::set<std::string> ports;
    for (const auto& p : services[0]["spec"]["ports"]) ports.insert(S(p["name"]));
    for (const auto& e : m["spec"]["endpoints"])
      EXPECT_TRUE(ports.count(S(e["port"]))) << S(e["port"]);
  }
  for (const auto& cm : r.OfKind("ConfigMap")) {
    for (const auto& kv : cm["data"]) {
      EXPECT_TRUE(std::regex_match(kv.first.as<std::string>(), std::regex("[A-Z_][A-Z0-9_]*")));
    }
  }
}

// `kubectl set env --local` decodes each object into kubectl's typed scheme offline. Returns
// the kinds it decoded; a decode error other than "kind not registered" fails the test.
std::set<std::string> TypedDecode(const Rendered& r) {
  std::set<std::string> decoded;
  TempDir dir;
  for (size_t i = 0; i < r.objects.size(); ++i) {
    const YAML::Node& o = r.objects[i];
    WriteTextFile(dir.File("object.yaml"), r.texts[i]);
    const std::string what = S(o["kind"]) + "/" + S(o["metadata"]["name"]);
    const ShellResult k =
        RunShell("KUBECONFIG=/dev/null kubectl set env --local -f " +
                 ShellQuote(dir.File("object.yaml")) + " MORSERVE_DECODE_CHECK=1 -o name");
    const std::string text = k.out + k.err;
    if (text.find("is registered for version") != std::string::npos) continue;  // unknown to it
    if (text.find("unable to decode") != std::string::npos) {
      ADD_FAILURE() << what << ": " << text;
    } else if (k.rc == 0 || text.find("does not have a pod template") != std::string::npos) {
      decoded.insert(S(o["apiVersion"]) + "/" + S(o["kind"]));
    } else {
      ADD_FAILURE() << what << ": " << text;
    }
  }
  return decoded;
}

class DeployKubernetesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(HaveCommand("kubectl"))
        << "kubectl is required (scripts/install_deps.sh installs Debian's kubernetes-client)";
    std::cout << "kubectl: " << RunShell("kubectl version --client 2>&1 | head -1").out;
  }
};

TEST_F(DeployKubernetesTest, BaseRendersAndItsObjectsAreConsistent) {
  const Rendered base = Render("deploy/kubernetes/base");
  CheckObjects(base);
  const YAML::Node sc =
      base.Named("Deployment", "morserve-server")["spec"]["template"]["spec"]["containers"][0];
  EXPECT_EQ(S(sc["image"]), "morserve:cpu");
  EXPECT_FALSE(sc["resources"]["requests"]["nvidia.com/gpu"]);
}

TEST_F(DeployKubernetesTest, GpuOverlayRequestsAGpuAndRunsTheCudaImage) {
  const Rendered gpu = Render("deploy/kubernetes/overlays/gpu");
  CheckObjects(gpu);
  const YAML::Node server = gpu.Named("Deployment", "morserve-server");
  ASSERT_TRUE(server);
  const YAML::Node pod = server["spec"]["template"]["spec"];
  const YAML::Node c = pod["containers"][0];
  EXPECT_EQ(S(c["image"]), "morserve:gpu");
  EXPECT_EQ(S(c["resources"]["requests"]["nvidia.com/gpu"]), "1");
  EXPECT_EQ(S(c["resources"]["limits"]["nvidia.com/gpu"]), "1");
  bool tolerates = false;
  for (const auto& t : pod["tolerations"]) tolerates |= S(t["key"]) == "nvidia.com/gpu";
  EXPECT_TRUE(tolerates);
  // The patch kept the base's container fields (probes, mounts) and added /dev/shm.
  EXPECT_TRUE(c["startupProbe"]["grpc"]);
  std::set<std::string> mounts;
  for (const auto& m : c["volumeMounts"]) mounts.insert(S(m["mountPath"]));
  EXPECT_EQ(mounts, (std::set<std::string>{"/models", "/tmp", "/dev/shm"}));
  // The flags ConfigMap merged: GPU values over the base's, base-only keys kept.
  const YAML::Node flags = gpu.Named("ConfigMap", S(c["envFrom"][0]["configMapRef"]["name"]));
  EXPECT_EQ(S(flags["data"]["MORSERVE_WEIGHTS"]), "bf16");
  EXPECT_EQ(S(flags["data"]["MORSERVE_MODEL_DIR"]), "/models/model");
  // Gateways stay on CPU.
  const YAML::Node gc =
      gpu.Named("Deployment", "morserve-gateway")["spec"]["template"]["spec"]["containers"][0];
  EXPECT_FALSE(gc["resources"]["requests"]["nvidia.com/gpu"]);
}

TEST_F(DeployKubernetesTest, KubectlDecodesTheBuiltInObjectsOffline) {
  for (const char* dir : {"deploy/kubernetes/base", "deploy/kubernetes/overlays/gpu"}) {
    const Rendered r = Render(dir);
    ASSERT_EQ(r.error, "");
    const std::set<std::string> decoded = TypedDecode(r);
    std::string list;
    for (const auto& k : decoded) list += k + " ";
    std::cout << dir << ": typed-decoded by kubectl: " << list << "\n";
    // Known to every kubectl: the core kinds and apps/v1 Deployments.
    for (const char* k :
         {"apps/v1/Deployment", "v1/Service", "v1/ConfigMap", "v1/PersistentVolumeClaim"}) {
      EXPECT_TRUE(decoded.count(k)) << dir << ": " << k;
    }
  }
  // The same route rejects a wrong field type.
  Rendered bad;
  bad.texts.push_back(
      "apiVersion: v1\nkind: Service\nmetadata: {name: x, labels: {app.kubernetes.io/name: "
      "morserve}}\n"
      "spec: {ports: [{port: not-a-number}]}\n");
  bad.objects.push_back(YAML::Load(bad.texts.back()));
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    TypedDecode(bad);
  }
  ASSERT_EQ(failures.size(), 1) << "a Service with a string port decoded without error";
  EXPECT_NE(std::string(failures.GetTestPartResult(0).message()).find("unable to decode"),
            std::string::npos);
}

TEST_F(DeployKubernetesTest, PrometheusAdapterServesTheHpaMetric) {
  const YAML::Node values =
      YAML::LoadFile(RepoPath("deploy/kubernetes/prometheus-adapter/values.yaml"));
  const YAML::Node rule = values["rules"]["custom"][0];
  const PromQlRefs refs = ParsePromQlRefs(S(rule["seriesQuery"]));
  ASSERT_EQ(refs.error, "");
  ASSERT_EQ(refs.metrics.size(), 1u);
  EXPECT_EQ(refs.metrics.begin()->first, "morserve_requests_waiting");
  EXPECT_EQ(S(rule["name"]["as"]), "morserve_requests_waiting");
  const Rendered base = Render("deploy/kubernetes/base");
  EXPECT_EQ(
      S(base.OfKind("HorizontalPodAutoscaler")[0]["spec"]["metrics"][0]["pods"]["metric"]["name"]),
      S(rule["name"]["as"]));
}

}  // namespace
}  // namespace morserve::testing
