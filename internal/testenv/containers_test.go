package testenv

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
)

// envChild makes this test binary, run again by
// TestContainerLeavesWithItsBinary, the child that takes Redis from a
// container.
const envChild = "DEDUP_TESTENV_CONTAINER_CHILD"

func TestContainerMode(t *testing.T) {
	for _, c := range []struct {
		value   string
		want    string
		wantErr bool
	}{{"", "", false}, {"only", "only", false}, {"off", "off", false}, {"yes", "", true}, {"ONLY", "", true}} {
		t.Setenv(envContainers, c.value)
		got, err := containerMode()
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("%s=%q: %q, %v; want %q, error %v", envContainers, c.value, got, err, c.want, c.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), envContainers) {
			t.Errorf("the error %q does not name %s", err, envContainers)
		}
	}
	t.Setenv(envContainers, "off")
	if why := dockerAvailable(); !strings.Contains(why, envContainers+"=off") {
		t.Errorf("with containers off, dockerAvailable says %q", why)
	}
}

func TestOnlyContainersSkipsTopologies(t *testing.T) {
	t.Setenv(envContainers, "")
	if why := onlyContainersWhy("a Redis Cluster", ".ci/redis-cluster.sh"); why != "" {
		t.Errorf("containers not forced, yet a topology is refused: %q", why)
	}
	t.Setenv(envContainers, "only")
	why := onlyContainersWhy("a Redis Cluster", ".ci/redis-cluster.sh")
	for _, want := range []string{"a Redis Cluster", ".ci/redis-cluster.sh", envContainers + "=only"} {
		if !strings.Contains(why, want) {
			t.Errorf("the skip message %q does not name %q", why, want)
		}
	}
}

// TestContainerLeavesWithItsBinary runs this test binary again as a child
// that takes Redis from a container while $REDIS_URL names a closed port
// (DEDUP_TEST_CONTAINERS=only), and checks that the child got a server of
// its own that answers, and that the container is gone once the child has
// exited: at its end, and when it is killed.
func TestContainerLeavesWithItsBinary(t *testing.T) {
	needDocker(t)
	for _, how := range []string{"exit", "kill"} {
		t.Run(how, func(t *testing.T) {
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			closed := "redis://127.0.0.1:" + strconv.Itoa(FreePort(t)) + "/0"
			cmd := exec.Command(self)
			cmd.Env = append(childEnviron(), envChild+"=1", envContainers+"=only", "REDIS_URL="+closed)
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			lines := make(chan string, 16)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					lines <- sc.Text()
				}
			}()
			url := childURL(t, lines)
			if url == closed {
				t.Fatalf("the child used $REDIS_URL %s; want a container's", url)
			}
			if err := pingRedisURL(url); err != nil {
				t.Fatalf("the child's Redis %s does not answer: %v", url, err)
			}
			pid := cmd.Process.Pid
			if n := childContainers(t, pid); n != 1 {
				t.Fatalf("the child (pid %d) has %d containers; want 1", pid, n)
			}
			if how == "kill" {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			} else {
				_ = stdin.Close() // the child returns and exits
			}
			err = cmd.Wait()
			if how == "exit" && err != nil {
				t.Fatalf("the child failed: %v", err)
			}
			Eventually(t, 30*time.Second, "the child's container removed", func() bool { return childContainers(t, pid) == 0 })
		})
	}
}

// TestContainerInherited checks that a test binary run by another takes
// the container its parent names in DEDUP_TESTENV_REDIS_CONTAINER, even
// under DEDUP_TEST_CONTAINERS=only, and starts none of its own: a test and
// the process it runs must share one Redis.
func TestContainerInherited(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	parents := "redis://127.0.0.1:" + strconv.Itoa(FreePort(t)) + "/0"
	cmd := exec.Command(self)
	cmd.Env = append(childEnviron(), envChild+"=1", envContainers+"=only", "DEDUP_TESTENV_REDIS_CONTAINER="+parents)
	cmd.Stdin = strings.NewReader("")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the child failed: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != "url "+parents {
		t.Fatalf("the child printed %q; want %q, its parent's container", got, "url "+parents)
	}
}

// childEnviron is this process's environment without the containers it
// hands down to its children.
func childEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DEDUP_TESTENV_") {
			env = append(env, kv)
		}
	}
	return env
}

// childURL waits up to 5 minutes (a first run may pull the image) for the
// child's "url " line.
func childURL(t *testing.T, lines <-chan string) string {
	t.Helper()
	deadline := time.After(5 * time.Minute)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the child ended without a URL")
			}
			if u, ok := strings.CutPrefix(l, "url "); ok {
				return u
			}
		case <-deadline:
			t.Fatal("no URL from the child within 5 minutes")
		}
	}
}

// childContainers counts the containers, running or not, that the test
// binary of pid started.
func childContainers(t *testing.T, pid int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: client.Filters{}.Add("label", labelPid+"="+strconv.Itoa(pid)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return len(res.Items)
}

func init() {
	if os.Getenv(envChild) == "1" {
		os.Exit(containerChild())
	}
}

// containerChild is the child of TestContainerLeavesWithItsBinary: it
// prints the URL of its Redis, then waits for its input to end.
func containerChild() int {
	url, why := FindRedis()
	if why != "" {
		os.Stderr.WriteString("child: " + why + "\n")
		return 1
	}
	os.Stdout.WriteString("url " + url + "\n")
	_, _ = bufio.NewReader(os.Stdin).ReadString(0)
	return 0
}

// TestRemoveOrphans checks that a container testenv started for a test
// binary that no longer runs is removed by the next binary that looks for
// a Docker engine, and that one whose binary still runs is left alone.
func TestRemoveOrphans(t *testing.T) {
	needDocker(t)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), containerStartWithin)
	defer cancel()
	start := func(pid int) string {
		opts := append(containerOpts(),
			testcontainers.WithLabels(map[string]string{labelPid: strconv.Itoa(pid)}),
			// No TCP port: nothing to collide with on the host's network.
			testcontainers.WithCmd("redis-server", "--port", "0"))
		ctr, err := testcontainers.Run(ctx, imageOf(envRedisImage, DefaultRedisImage), opts...)
		if err := started(ctr, err, "redis"); err != nil {
			t.Fatal(err)
		}
		return ctr.GetContainerID()
	}
	orphan, live := start(gone.Process.Pid), start(os.Getpid())
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	removeOrphans(ctx, cli)
	exists := func(id string) bool {
		res, err := cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("id", id)})
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Items) == 1
	}
	if exists(orphan) {
		t.Errorf("the container of exited pid %d is still there", gone.Process.Pid)
	}
	if !exists(live) {
		t.Errorf("the container of this running binary was removed")
	}
}

// needDocker skips t without a Docker engine, except where one is
// required: under DEDUP_TEST_CONTAINERS=only, and under
// DEDUP_REQUIRE_SERVICES=1 unless DEDUP_TEST_CONTAINERS=off says that
// this run uses no container (as .ci/run's main suite, whose servers are
// local; its container step runs these tests with only).
func needDocker(t *testing.T) {
	t.Helper()
	why := dockerAvailable()
	if why == "" {
		return
	}
	mode, _ := containerMode()
	if mode == "only" || mode != "off" && os.Getenv("DEDUP_REQUIRE_SERVICES") == "1" {
		t.Fatalf("testenv: needs a Docker engine: %s", why)
	}
	t.Skipf("needs a Docker engine: %s", why)
}
