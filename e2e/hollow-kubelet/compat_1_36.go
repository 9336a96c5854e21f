//go:build k8s_1_36

// Kubernetes 1.36 spellings of what compat.go does for 1.37 and later.

package main

import (
	"context"
	"time"

	noopoteltrace "go.opentelemetry.io/otel/trace/noop"
	v1 "k8s.io/api/core/v1"
	internalapi "k8s.io/cri-api/pkg/apis"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

func newRuntimeService(ctx context.Context, endpoint string) (internalapi.RuntimeService, error) {
	return remote.NewRemoteRuntimeService(ctx, endpoint, 15*time.Second, noopoteltrace.NewTracerProvider(), false)
}

func (m *draContainerManager) UpdateAllocatedResourcesStatus(pod *v1.Pod, status *v1.PodStatus) {
	m.dra.UpdateAllocatedResourcesStatus(pod, status)
}

// The 1.36 DRA manager has no Stop; its goroutines end with the process.
func stopDRA(*dra.Manager) {}
