// Command etcd runs etcd's own entry point; see go.mod for why this wrapper exists.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
