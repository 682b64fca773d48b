// Command coredns is CoreDNS with only the plugins the test bed's cluster DNS uses: it answers
// the cluster zone from the API server (kubernetes plugin) and nothing else. Without the forward
// plugin it cannot send a query beyond the test bed.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The plugins' order within a server block, as CoreDNS's own plugin.cfg orders them.
	dnsserver.Directives = []string{"ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes"}
}

func main() { coremain.Run() }
