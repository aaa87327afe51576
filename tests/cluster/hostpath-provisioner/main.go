// Command hostpath-provisioner is a tiny dynamic provisioner for the single-node test cluster.
// For every claim of a StorageClass whose provisioner is "kubetf.io/hostpath" it makes a world-writable
// directory under -root and a hostPath PersistentVolume with the claim's size and access modes (ReadWriteOnce
// and ReadWriteMany alike: there is one node). Deleting the volume removes the directory.
// It runs on the host next to the kubelet, with a kubeconfig.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
)

type hostPath struct{ root string }

func (p *hostPath) Provision(_ context.Context, o controller.ProvisionOptions) (*v1.PersistentVolume, controller.ProvisioningState, error) {
	dir := filepath.Join(p.root, o.PVName)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	if err := os.Chmod(dir, 0o1777); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	dirType := v1.HostPathDirectory
	reclaim := v1.PersistentVolumeReclaimDelete
	if o.StorageClass.ReclaimPolicy != nil {
		reclaim = *o.StorageClass.ReclaimPolicy
	}
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: o.PVName, Labels: map[string]string{"kubetf.io/hostpath": "true"}},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeReclaimPolicy: reclaim,
			AccessModes:                   o.PVC.Spec.AccessModes,
			Capacity:                      v1.ResourceList{v1.ResourceStorage: o.PVC.Spec.Resources.Requests[v1.ResourceStorage]},
			VolumeMode:                    o.PVC.Spec.VolumeMode,
			MountOptions:                  o.StorageClass.MountOptions,
			PersistentVolumeSource: v1.PersistentVolumeSource{
				HostPath: &v1.HostPathVolumeSource{Path: dir, Type: &dirType},
			},
		},
	}, controller.ProvisioningFinished, nil
}

func (p *hostPath) Delete(_ context.Context, pv *v1.PersistentVolume) error {
	if pv.Spec.HostPath == nil {
		return &controller.IgnoredError{Reason: "not a hostPath volume"}
	}
	dir := filepath.Clean(pv.Spec.HostPath.Path)
	if !strings.HasPrefix(dir, filepath.Clean(p.root)+string(os.PathSeparator)) {
		return &controller.IgnoredError{Reason: "not under " + p.root}
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig")
	root := flag.String("root", "/var/lib/kubetf-cluster/volumes", "directory holding the volumes")
	name := flag.String("name", "kubetf.io/hostpath", "provisioner name")
	klog.InitFlags(nil)
	flag.Parse()
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	if err := os.MkdirAll(*root, 0o755); err != nil {
		klog.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("hostpath-provisioner %s: volumes under %s\n", *name, *root)
	pc := controller.NewProvisionController(ctx, client, *name, &hostPath{root: *root},
		controller.LeaderElection(false), controller.Threadiness(4))
	pc.Run(ctx)
}
