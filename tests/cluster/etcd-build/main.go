// Command etcd is upstream etcd's server, built through a wrapper module (go install of
// go.etcd.io/etcd/server/v3 does not work because of its replace directives).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
