// Command kubectl-raid10 is the kubectl plugin (`kubectl raid10 ...`) and the local admin tool
// of raid10-csi: it lists disks, volumes and their health, and replaces failed disks, either
// through the cluster's custom resources or directly on a node.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] == "help" || os.Args[1] == "-h" || os.Args[1] == "--help" {
		fmt.Println("usage: kubectl raid10 <command>\n\ncommands arrive with the disk-pool and CSI issues")
		return
	}
	fmt.Fprintf(os.Stderr, "kubectl-raid10: unknown command %q\n", os.Args[1])
	os.Exit(2)
}
