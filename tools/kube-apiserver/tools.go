//go:build tools

// Package tools pins the programs scripts/install-kube.sh (kube-apiserver, for every kube test) and
// scripts/install-kube-node.sh (the rest: the single-node cluster of tests/kube/node.py) build, so
// `go mod tidy` keeps their dependencies. The node's programs added requirements only: no version changed,
// so kube-apiserver's build cache stays valid.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
