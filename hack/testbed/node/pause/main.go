// Command pause sleeps until SIGINT or SIGTERM and reaps every child that exits meanwhile.
//
// The test bed uses it twice: as the sandbox ("pause") image that holds a pod's namespaces, and
// as process 1 of the real node's PID namespace, where daemonised processes (containerd shims)
// are re-parented and must be reaped; when it exits, the kernel kills everything in that namespace.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reapExited()
	}
}

// reapExited collects every exited child; signals coalesce, so one SIGCHLD may stand for several.
func reapExited() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
