//go:build tools

// Package tools pins the programs scripts/install-kube.sh builds, so `go mod tidy` keeps their dependencies.
// kube-apiserver serves every kube test; the rest make the single-node cluster of tests/kube/node.py.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
