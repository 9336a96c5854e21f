// tessera-hollow-kubelet runs the real kubelet code for one simulated node of Tessera's
// test bed: the kubelet's own plugin manager registers tessera-plugin through the
// kubelet's registration client, and the kubelet's real DRA manager
// (k8s.io/kubernetes/pkg/kubelet/cm/dra) prepares and unprepares claims over the plugin's
// socket, checkpoints them, watches device health and fills allocatedResourcesStatus.
//
// Its container runtime is either simulated, an in-process fake CRI server
// (k8s.io/cri-client/pkg/fake), so no containerd, runc, images or cgroups are needed; or,
// with --container-runtime-endpoint, a real one (containerd), with what a kubelet needs
// to run real containers: the kubelet's own volume plugins, mounter and host utilities,
// its prober, and its server (logs, exec) with x509 client authentication and webhook
// authorization. Either way, the kubelet's CreateContainer requests are appended, one JSON
// object a line, to <root-dir>/containers.jsonl so tests can read the CDI device ids the
// kubelet handed to the runtime.
//
// The container manager stays kubemark's stub (with the real DRA manager, below) in both
// modes: the real one would take over the host's cgroup hierarchy and kernel settings
// (vm.overcommit_memory, kernel.panic), which a test bed sharing a machine must not
// touch, and it adds nothing to what DRA does (docs/development/test-bed.md).
//
// It follows kubemark's hollow node (pkg/kubemark, cmd/kubemark/app/hollow_node.go) with
// two changes: stock kubemark passes a stub container manager whose DRA hooks do nothing,
// so this one wraps the stub with a real DRA manager hooked in as
// pkg/kubelet/cm/container_manager_linux.go does; and it opens no TCP port (kubelet
// server, read-only and healthz ports off) and keeps everything under --root-dir.
//
// The Go source is built by tessera-e2e (e2e/src/binaries.rs) against each Kubernetes
// release the suite runs, with a go.mod generated like the control plane's.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	noopoteltrace "go.opentelemetry.io/otel/trace/noop"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	"k8s.io/kubernetes/pkg/kubelet"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/resourceupdates"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"k8s.io/kubernetes/pkg/kubelet/status"
	kubetypes "k8s.io/kubernetes/pkg/kubelet/types"
	"k8s.io/kubernetes/pkg/kubemark"
)

func main() {
	var (
		kubeconfig = flag.String("kubeconfig", "", "kubeconfig of the kubelet's API identity (required)")
		nodeName   = flag.String("node-name", "", "name of the Node the kubelet registers (required)")
		rootDir    = flag.String("root-dir", "", "absolute kubelet root directory: plugins_registry/, plugins/, DRA checkpoint, fake CRI socket, containers.jsonl (required)")
		nodeLabels = flag.String("node-labels", "", "labels the kubelet registers its Node with, k=v[,k=v...]")
		maxPods    = flag.Int("max-pods", 110, "pods the node admits")
		runtime    = flag.String("container-runtime-endpoint", "", "CRI endpoint of a real container runtime (unix://...); empty: the in-process fake CRI")
		nodeIP     = flag.String("node-ip", "", "the node's address (with --container-runtime-endpoint); the kubelet server listens there")
		port       = flag.Int("port", 10250, "port of the kubelet server (with --container-runtime-endpoint)")
		clientCA   = flag.String("client-ca-file", "", "CA of the client certificates the kubelet server accepts (the API server's); required with --container-runtime-endpoint")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" || *nodeName == "" || *rootDir == "" || !filepath.IsAbs(*rootDir) {
		fmt.Fprintln(os.Stderr, "tessera-hollow-kubelet: --kubeconfig, --node-name and an absolute --root-dir are required")
		flag.Usage()
		os.Exit(2)
	}
	labels, err := parseLabels(*nodeLabels)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tessera-hollow-kubelet: --node-labels: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var cri *criOptions
	if *runtime != "" {
		if *nodeIP == "" || *clientCA == "" {
			fmt.Fprintln(os.Stderr, "tessera-hollow-kubelet: --container-runtime-endpoint needs --node-ip and --client-ca-file")
			os.Exit(2)
		}
		cri = &criOptions{endpoint: *runtime, nodeIP: *nodeIP, port: *port, clientCA: *clientCA}
	}
	if err := run(ctx, *kubeconfig, *nodeName, *rootDir, labels, *maxPods, cri); err != nil {
		klog.ErrorS(err, "tessera-hollow-kubelet failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", kv)
		}
		labels[k] = v
	}
	return labels, nil
}

// criOptions: a real container runtime and the kubelet server that goes with it.
type criOptions struct {
	endpoint string
	nodeIP   string
	port     int
	clientCA string
}

func run(ctx context.Context, kubeconfig, nodeName, rootDir string, labels map[string]string, maxPods int, cri *criOptions) error {
	logger := klog.FromContext(ctx)
	for _, dir := range []string{rootDir, filepath.Join(rootDir, "pod-logs")} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	clientConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig %s: %w", kubeconfig, err)
	}
	clientConfig.UserAgent = "tessera-hollow-kubelet"
	f, c := kubeletConfig(nodeName, rootDir, labels, maxPods)
	if cri != nil {
		withRuntime(f, c, rootDir, cri)
	}
	// As the kubelet's buildKubeletClientConfig (cmd/kubelet/app/server.go): its API
	// client is throttled at kubeAPIQPS/kubeAPIBurst and speaks its content type. A bare
	// client-go config would throttle at client-go's own defaults, far below a real
	// kubelet's, and a pod's start would queue behind the previous pod's teardown calls.
	clientConfig.QPS = float32(c.KubeAPIQPS)
	clientConfig.Burst = int(c.KubeAPIBurst)
	clientConfig.ContentType = c.ContentType
	if c.ContentType == "application/vnd.kubernetes.protobuf" {
		clientConfig.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	}
	client, err := clientset.NewForConfig(clientConfig)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	// Events go through their own client at eventRecordQPS/eventBurst, as in the
	// kubelet, so a burst of events never delays a status update.
	eventConfig := *clientConfig
	eventConfig.QPS = float32(c.EventRecordQPS)
	if c.EventRecordQPS == 0 {
		eventConfig.QPS = -1 // the kubelet's meaning of zero: no limit
	}
	eventConfig.Burst = int(c.EventBurst)
	eventClient, err := clientset.NewForConfig(&eventConfig)
	if err != nil {
		return fmt.Errorf("create event client: %w", err)
	}

	// As kubemark: the heartbeat client times out within a lease period and is not
	// rate-limited, so node status never queues behind other requests.
	heartbeatConfig := *clientConfig
	heartbeatConfig.Timeout = c.NodeStatusUpdateFrequency.Duration
	if lease := time.Duration(c.NodeLeaseDurationSeconds) * time.Second; heartbeatConfig.Timeout > lease {
		heartbeatConfig.Timeout = lease
	}
	heartbeatConfig.QPS = -1
	heartbeatClient, err := clientset.NewForConfig(&heartbeatConfig)
	if err != nil {
		return fmt.Errorf("create heartbeat client: %w", err)
	}

	var runtimeService internalapi.RuntimeService
	var imageService internalapi.ImageManagerService
	if cri == nil {
		endpoint := "unix://" + filepath.Join(rootDir, "cri.sock")
		_ = os.Remove(filepath.Join(rootDir, "cri.sock"))
		fakeRuntime := fakeremote.NewFakeRemoteRuntime()
		if err := fakeRuntime.Start(endpoint); err != nil {
			return fmt.Errorf("start fake CRI at %s: %w", endpoint, err)
		}
		defer fakeRuntime.Stop()
		runtimeService, err = newRuntimeService(ctx, endpoint)
		if err != nil {
			return fmt.Errorf("connect to fake CRI: %w", err)
		}
		imageService = fakeRuntime.ImageService
	} else {
		// The kubelet's own connection to the runtime, as its run() makes it.
		services := &kubelet.Dependencies{TracerProvider: noopoteltrace.NewTracerProvider()}
		if err := kubelet.PreInitRuntimeService(ctx, c, services); err != nil {
			return fmt.Errorf("connect to the container runtime at %s: %w", cri.endpoint, err)
		}
		runtimeService, imageService = services.RemoteRuntimeService, services.RemoteImageService
	}
	recorder, err := newRecordingRuntime(runtimeService, filepath.Join(rootDir, "containers.jsonl"))
	if err != nil {
		return err
	}
	defer recorder.close()

	// The DRA manager keeps its checkpoint in the root dir, as the kubelet's does, so a
	// restarted kubelet knows which claims it prepared.
	draManager, err := dra.NewManager(logger, client, rootDir)
	if err != nil {
		return fmt.Errorf("create DRA manager: %w", err)
	}
	containerManager := &draContainerManager{ContainerManager: cm.NewStubContainerManager(), dra: draManager}

	hollow := kubemark.NewHollowKubelet(f, c, client, heartbeatClient,
		&cadvisortest.Fake{NodeName: nodeName}, imageService, recorder, containerManager)
	server := &options.KubeletServer{KubeletFlags: *f, KubeletConfiguration: *c}
	if cri != nil {
		if err := realNodeDependencies(ctx, server, hollow.KubeletDeps, client, nodeName); err != nil {
			return err
		}
	}
	// Kubemark records events nowhere; the kubelet's real recorder sends them to the API
	// server, where tests read what a user would see in kubectl describe pod
	// (FailedPrepareDynamicResources and the like). RunKubelet makes it when none is set.
	hollow.KubeletDeps.Recorder = nil
	hollow.KubeletDeps.EventClient = eventClient.CoreV1()
	if err := kubeletapp.RunKubelet(ctx, server, hollow.KubeletDeps); err != nil {
		return fmt.Errorf("run kubelet: %w", err)
	}
	logger.Info("tessera-hollow-kubelet running", "node", nodeName, "rootDir", rootDir)
	<-ctx.Done()
	stopDRA(draManager)
	return nil
}

// kubeletConfig is kubemark.GetHollowKubeletConfig without its temporary directories and
// TCP listeners: everything lives under rootDir, and no port is opened.
func kubeletConfig(nodeName, rootDir string, labels map[string]string, maxPods int) (*options.KubeletFlags, *kubeletconfig.KubeletConfiguration) {
	f := options.NewKubeletFlags()
	f.RootDirectory = rootDir
	f.HostnameOverride = nodeName
	f.MinimumGCAge = metav1.Duration{Duration: time.Minute}
	f.MaxContainerCount = 100
	f.MaxPerPodContainerCount = 2
	f.NodeLabels = labels

	c, err := options.NewKubeletConfiguration()
	if err != nil {
		panic(err)
	}
	c.StaticPodURL = ""
	c.StaticPodPath = ""
	c.EnableServer = false
	c.Address = "127.0.0.1"
	c.Port = 0
	c.ReadOnlyPort = 0
	c.HealthzPort = 0
	c.FileCheckFrequency.Duration = 20 * time.Second
	c.HTTPCheckFrequency.Duration = 20 * time.Second
	c.NodeStatusUpdateFrequency.Duration = 10 * time.Second
	c.NodeStatusReportFrequency.Duration = 5 * time.Minute
	c.SyncFrequency.Duration = 10 * time.Second
	c.EvictionPressureTransitionPeriod.Duration = 5 * time.Minute
	c.MaxPods = int32(maxPods)
	c.PodsPerCore = 0
	c.ClusterDNS = []string{}
	c.ImageGCHighThresholdPercent = 90
	c.ImageGCLowThresholdPercent = 80
	c.ProviderID = "tessera-hollow://" + nodeName
	c.VolumeStatsAggPeriod.Duration = time.Minute
	c.CgroupRoot = ""
	c.CPUCFSQuota = true
	c.EnableControllerAttachDetach = false
	c.EnableDebuggingHandlers = false
	c.CgroupsPerQOS = false
	c.HairpinMode = kubeletconfig.HairpinVeth
	c.MaxOpenFiles = 1024
	c.RegistryBurst = 10
	c.RegistryPullQPS = 5.0
	c.ResolverConfig = kubetypes.ResolvConfDefault
	c.KubeletCgroups = "/kubelet"
	c.SerializeImagePulls = true
	c.SystemCgroups = ""
	c.ProtectKernelDefaults = false
	c.RegisterNode = true
	c.LocalStorageCapacityIsolation = true
	c.PodLogsDir = filepath.Join(rootDir, "pod-logs")
	return f, c
}

// withRuntime configures the kubelet for a real container runtime: the runtime's
// endpoint, the cgroup driver runc uses by default, and the kubelet server the API server
// reaches for logs and exec, authenticating it by its client certificate and authorizing
// with SubjectAccessReviews, as a real node's kubelet does.
func withRuntime(f *options.KubeletFlags, c *kubeletconfig.KubeletConfiguration, rootDir string, cri *criOptions) {
	c.ContainerRuntimeEndpoint = cri.endpoint
	c.ImageServiceEndpoint = cri.endpoint
	c.CgroupDriver = "cgroupfs"
	f.NodeIP = cri.nodeIP
	c.EnableServer = true
	c.Address = cri.nodeIP
	c.Port = int32(cri.port)
	c.EnableDebuggingHandlers = true
	c.Authentication.Anonymous.Enabled = false
	c.Authentication.Webhook.Enabled = true
	c.Authentication.X509.ClientCAFile = cri.clientCA
	c.Authorization.Mode = kubeletconfig.KubeletAuthorizationModeWebhook
	// Under the root dir, not the kubelet's defaults (/var/lib/kubelet/pki,
	// /usr/libexec/kubernetes/...), so nothing is written outside it.
	f.CertDirectory = filepath.Join(rootDir, "pki")
	c.VolumePluginDir = filepath.Join(rootDir, "volume-plugins")
}

// realNodeDependencies replaces kubemark's fakes with what the kubelet's run() uses
// (UnsecuredDependencies): the real mounter, host utilities, subpath handling and volume
// plugins, so volumes are really set up for the runtime to mount, the real OOM adjuster,
// the serving certificate, the prober (HTTP probes reach the pods), and the
// authenticator and authorizer of the kubelet server.
func realNodeDependencies(ctx context.Context, s *options.KubeletServer, d *kubelet.Dependencies, client clientset.Interface, nodeName string) error {
	real, err := kubeletapp.UnsecuredDependencies(ctx, s, utilfeature.DefaultFeatureGate)
	if err != nil {
		return fmt.Errorf("kubelet dependencies: %w", err)
	}
	d.Mounter = real.Mounter
	d.Subpather = real.Subpather
	d.HostUtil = real.HostUtil
	d.OSInterface = real.OSInterface
	d.VolumePlugins = real.VolumePlugins
	d.DynamicPluginProber = real.DynamicPluginProber
	d.OOMAdjuster = real.OOMAdjuster
	d.TLSOptions = real.TLSOptions
	d.ProbeManager = nil
	auth, runCAReload, err := kubeletapp.BuildAuth(types.NodeName(nodeName), client, s.KubeletConfiguration)
	if err != nil {
		return fmt.Errorf("kubelet server authentication: %w", err)
	}
	d.Auth = auth
	runCAReload(ctx.Done())
	return nil
}

// draContainerManager is the stub container manager with the real DRA manager hooked in
// where containerManagerImpl (container_manager_linux.go) hooks it: start, plugin
// registration, pod prepare/unprepare, CDI devices for containers, health updates and
// allocatedResourcesStatus.
type draContainerManager struct {
	cm.ContainerManager
	dra *dra.Manager
}

func (m *draContainerManager) Start(ctx context.Context, node *v1.Node, activePods cm.ActivePodsFunc, getNode cm.GetNodeFunc,
	sourcesReady config.SourcesReady, podStatusProvider status.PodStatusProvider, runtimeService internalapi.RuntimeService,
	localStorageCapacityIsolation bool) error {
	if err := m.dra.Start(ctx, dra.ActivePodsFunc(activePods), dra.GetNodeFunc(getNode), sourcesReady); err != nil {
		return fmt.Errorf("start dra manager error: %w", err)
	}
	return m.ContainerManager.Start(ctx, node, activePods, getNode, sourcesReady, podStatusProvider, runtimeService, localStorageCapacityIsolation)
}

func (m *draContainerManager) GetPluginRegistrationHandlers() map[string]cache.PluginHandler {
	return map[string]cache.PluginHandler{pluginwatcherapi.DRAPlugin: m.dra.GetWatcherHandler()}
}

func (m *draContainerManager) GetResources(ctx context.Context, pod *v1.Pod, container *v1.Container) (*kubecontainer.RunContainerOptions, error) {
	opts, err := m.ContainerManager.GetResources(ctx, pod, container)
	if err != nil {
		return nil, err
	}
	resOpts, err := m.dra.GetResources(pod, container)
	if err != nil {
		return nil, err
	}
	opts.CDIDevices = append(opts.CDIDevices, resOpts.CDIDevices...)
	return opts, nil
}

func (m *draContainerManager) PrepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	return m.dra.PrepareResources(ctx, pod)
}

func (m *draContainerManager) UnprepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	return m.dra.UnprepareResources(ctx, pod)
}

func (m *draContainerManager) PodMightNeedToUnprepareResources(uid types.UID) bool {
	return m.dra.PodMightNeedToUnprepareResources(uid)
}

func (m *draContainerManager) Updates() <-chan resourceupdates.Update {
	return m.dra.Updates()
}

// recordingRuntime is the CRI client with CreateContainer recorded: what the kubelet
// hands the runtime is what tests check.
type recordingRuntime struct {
	internalapi.RuntimeService
	mu  sync.Mutex
	out *os.File
}

// containerRecord is one line of containers.jsonl.
type containerRecord struct {
	PodUID      string   `json:"podUID"`
	Namespace   string   `json:"namespace"`
	Pod         string   `json:"pod"`
	Container   string   `json:"container"`
	ContainerID string   `json:"containerID"`
	CDIDevices  []string `json:"cdiDevices"`
}

func newRecordingRuntime(inner internalapi.RuntimeService, path string) (*recordingRuntime, error) {
	out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return &recordingRuntime{RuntimeService: inner, out: out}, nil
}

func (r *recordingRuntime) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.out.Close()
}

func (r *recordingRuntime) CreateContainer(ctx context.Context, podSandboxID string, cfg *runtimeapi.ContainerConfig, sandboxConfig *runtimeapi.PodSandboxConfig) (string, error) {
	id, err := r.RuntimeService.CreateContainer(ctx, podSandboxID, cfg, sandboxConfig)
	if err != nil {
		return id, err
	}
	rec := containerRecord{
		PodUID:      sandboxConfig.GetMetadata().GetUid(),
		Namespace:   sandboxConfig.GetMetadata().GetNamespace(),
		Pod:         sandboxConfig.GetMetadata().GetName(),
		Container:   cfg.GetMetadata().GetName(),
		ContainerID: id,
		CDIDevices:  []string{},
	}
	for _, d := range cfg.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, d.GetName())
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return id, fmt.Errorf("record container: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// One write per line with O_APPEND, so a reader never sees half a record.
	if _, err := r.out.Write(append(line, '\n')); err != nil {
		return id, fmt.Errorf("record container: %w", err)
	}
	return id, nil
}
