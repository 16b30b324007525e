// Command coredns is CoreDNS built with only the plugins the test node's Corefile uses
// (tests/kube/node_config.py: corefile), the way CoreDNS documents builds with external source code:
// this program sets the directives and imports their plugins instead of core/plugin (every plugin,
// cloud SDKs included). scripts/install-kube-node.sh builds it when the official release (full CoreDNS)
// cannot be downloaded, and keys its cache by the CoreDNS version and this file's plugin list.
//
// To add a plugin: add its name to directives, in the order of CoreDNS's core/dnsserver/zdirectives.go
// (the order the plugins run in, not the Corefile's), and import its package below.
package main

import (
	"log"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/template"
)

// directives is the plugin list, in CoreDNS's execution order (a subset of its zdirectives.go).
// scripts/install-kube-node.sh reads it (one quoted name a line) for its cache key and its check of the binary.
var directives = []string{
	"bind",
	"errors",
	"cache",
	"template",
	"kubernetes",
}

func main() {
	if err := dnsserver.SetDirectives(directives); err != nil {
		log.Fatalf("coredns: %v", err)
	}
	coremain.Run()
}
