//go:build !k8s_1_36

// What differs from Kubernetes 1.36: the CRI client builder, the logger passed to
// UpdateAllocatedResourcesStatus, and DRA manager shutdown. The Rust builder sets the
// build tag k8s_1_<minor> (e2e/src/binaries.rs).

package main

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	internalapi "k8s.io/cri-api/pkg/apis"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

func newRuntimeService(ctx context.Context, endpoint string) (internalapi.RuntimeService, error) {
	return remote.NewRemoteRuntimeServiceBuilder().
		WithEndpoint(endpoint).
		WithConnectionTimeout(15 * time.Second).
		Build(ctx)
}

func (m *draContainerManager) UpdateAllocatedResourcesStatus(logger klog.Logger, pod *v1.Pod, status *v1.PodStatus) {
	m.dra.UpdateAllocatedResourcesStatus(logger, pod, status)
}

func stopDRA(m *dra.Manager) { m.Stop() }
