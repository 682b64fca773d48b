// Command amdgpu-device-plugin is the test bed's stand-in for the AMD GPU device plugin.
//
// It speaks the kubelet's real device-plugin API (v1beta1): it registers a resource (amd.com/gpu)
// with the kubelet, lists a fixed number of healthy devices, and answers Allocate. There is no GPU
// on the test machine, so the devices are names only: instead of the /dev/kfd and /dev/dri device
// nodes the real plugin hands out, Allocate gives the container an environment variable that lists
// the device ids the kubelet picked. Everything around it (capacity, scheduling, the kubelet's
// device manager and its checkpoint) is the real thing.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	envName string
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list once; the devices never change, so it then waits for the
// kubelet to close the stream.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, request *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	response := &pluginapi.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		log.Printf("allocate %v", container.DevicesIds)
		response.ContainerResponses = append(response.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{p.envName: strings.Join(container.DevicesIds, ",")},
		})
	}
	return response, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func main() {
	resource := flag.String("resource", "amd.com/gpu", "extended resource name to register")
	count := flag.Int("devices", 4, "number of devices to advertise")
	envName := flag.String("env", "EAGLE3_TESTBED_GPU_IDS", "variable that receives the allocated device ids")
	dir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	flag.Parse()

	p := &plugin{envName: *envName}
	for i := 0; i < *count; i++ {
		p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("standin-gpu-%d", i), Health: pluginapi.Healthy})
	}
	endpoint := "eagle3-amdgpu.sock"
	socket := filepath.Join(*dir, endpoint)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		log.Fatalf("listen on %s: %v", socket, err)
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() {
		if err := server.Serve(listener); err != nil {
			log.Fatalf("serve: %v", err)
		}
	}()
	if err := register(filepath.Join(*dir, filepath.Base(pluginapi.KubeletSocket)), endpoint, *resource); err != nil {
		log.Fatalf("register with the kubelet: %v", err)
	}
	log.Printf("registered %s with %d devices on %s", *resource, *count, socket)

	// A restarted kubelet removes every socket in its directory; the plugin then exits, so that
	// whoever runs it sees it and can start it again (the test bed never restarts its kubelet).
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	for {
		select {
		case <-stop:
			server.Stop()
			return
		case <-time.After(time.Second):
			if _, err := os.Stat(socket); err != nil {
				log.Fatalf("socket %s gone (kubelet restarted?): %v", socket, err)
			}
		}
	}
}

func register(kubeletSocket, endpoint, resource string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	return err
}
