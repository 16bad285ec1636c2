package echomq_test

// The fixture: a redis-server and an echomq-sidecar on free loopback ports,
// started once for the package's tests that need them and always stopped in
// TestMain, whatever the tests did.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const consumerName = "conformance-go"

var (
	fixtureOnce sync.Once
	shared      *cluster
	sharedErr   error
	// started lists every cluster, so TestMain stops them all.
	startedMu sync.Mutex
	started   []*cluster
)

func TestMain(m *testing.M) {
	code := m.Run()
	startedMu.Lock()
	for _, c := range started {
		c.close()
	}
	startedMu.Unlock()
	os.Exit(code)
}

// fixture returns the shared redis-server + sidecar, started on first use with
// the conformance suite's sidecar_args.
func fixture(t testing.TB) *cluster {
	t.Helper()
	fixtureOnce.Do(func() {
		var file scenarioFile
		if sharedErr = readJSON(filepath.Join(repoRoot(), "tests", "conformance", "scenarios.json"), &file); sharedErr != nil {
			return
		}
		shared, sharedErr = startCluster("127.0.0.1:"+strconv.Itoa(freePort()), file.SidecarArgs)
	})
	if sharedErr != nil {
		t.Fatalf("fixture: %v", sharedErr)
	}
	return shared
}

func repoRoot() string {
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		panic(err)
	}
	return dir
}

func sidecarBin() string {
	if bin := os.Getenv("ECHOMQ_SIDECAR_BIN"); bin != "" {
		return bin
	}
	return filepath.Join(repoRoot(), "target", "debug", "echomq-sidecar")
}

func readJSON(path string, into any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, into)
}

func freePort() int {
	// From 10000-31999, below the kernel's ephemeral range (32768 up): a
	// port the kernel handed out as free could be some outgoing
	// connection's before the sidecar binds it (CI saw EADDRINUSE).
	for {
		port := 10000 + rand.IntN(22000)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			l.Close()
			return port
		}
	}
}

// cluster is one redis-server and one sidecar in a temporary directory.
type cluster struct {
	dir       string
	redisAddr string
	redis     *exec.Cmd
	// listen is the sidecar's gRPC address as given to --listen (host:port or
	// unix:/path); admin its admin address.
	listen, admin string
	args          []string
	sidecar       *exec.Cmd
	// exited is closed when sidecar has exited (exec.Cmd.Wait may be called
	// once, by the goroutine started with the process).
	exited    chan struct{}
	closeOnce sync.Once
}

// startCluster starts redis-server and a sidecar listening on listen.
func startCluster(listen string, sidecarArgs []string) (*cluster, error) {
	bin := sidecarBin()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("sidecar binary %s: %v (build it with `cargo build --bin echomq-sidecar` or set ECHOMQ_SIDECAR_BIN)", bin, err)
	}
	dir, err := os.MkdirTemp("", "echomq-go-test-")
	if err != nil {
		return nil, err
	}
	c := &cluster{
		dir:       dir,
		redisAddr: "127.0.0.1:" + strconv.Itoa(freePort()),
		listen:    listen,
		admin:     "127.0.0.1:" + strconv.Itoa(freePort()),
	}
	startedMu.Lock()
	started = append(started, c)
	startedMu.Unlock()

	_, redisPort, _ := net.SplitHostPort(c.redisAddr)
	c.redis = exec.Command("redis-server", "--port", redisPort, "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	childOfTest(c.redis)
	if err := c.redis.Start(); err != nil {
		return c, fmt.Errorf("redis-server: %v", err)
	}
	if err := waitFor(10*time.Second, func() bool { _, err := redisDo(c.redisAddr, "PING"); return err == nil }); err != nil {
		return c, fmt.Errorf("redis-server did not answer PING on %s", c.redisAddr)
	}
	c.args = append([]string{
		"--redis-url", "redis://" + c.redisAddr,
		"--listen", listen,
		"--admin-listen", c.admin,
		"--consumer-name", consumerName,
	}, sidecarArgs...)
	return c, c.startSidecar()
}

func (c *cluster) startSidecar() error {
	log, err := os.OpenFile(filepath.Join(c.dir, "sidecar.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(sidecarBin(), c.args...)
	cmd.Stdout, cmd.Stderr = log, log
	childOfTest(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("sidecar: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	c.sidecar, c.exited = cmd, exited
	err = waitFor(30*time.Second, func() bool {
		select {
		case <-exited:
			return true
		default:
		}
		resp, err := http.Get("http://" + c.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	select {
	case <-exited:
		return fmt.Errorf("sidecar exited at start-up:\n%s", c.logTail())
	default:
	}
	if err != nil {
		return fmt.Errorf("sidecar not ready on %s within 30 s:\n%s", c.admin, c.logTail())
	}
	return nil
}

// killSidecar SIGKILLs the sidecar and waits until it is gone.
func (c *cluster) killSidecar() {
	if c.sidecar == nil {
		return
	}
	_ = c.sidecar.Process.Signal(syscall.SIGKILL)
	<-c.exited
	c.sidecar = nil
}

// stopSidecar ends the sidecar with SIGTERM (its graceful shutdown), then
// SIGKILL after 10 s.
func (c *cluster) stopSidecar() {
	if c.sidecar == nil {
		return
	}
	_ = c.sidecar.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		c.killSidecar()
	}
	c.sidecar = nil
}

func (c *cluster) close() {
	c.closeOnce.Do(func() {
		c.stopSidecar()
		if c.redis != nil && c.redis.Process != nil {
			_ = c.redis.Process.Kill()
			_ = c.redis.Wait()
		}
		_ = os.RemoveAll(c.dir)
	})
}

func (c *cluster) logTail() string {
	data, _ := os.ReadFile(filepath.Join(c.dir, "sidecar.log"))
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

func waitFor(limit time.Duration, ok func() bool) error {
	deadline := time.Now().Add(limit)
	for {
		if ok() {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisDo runs one command on a fresh connection and returns the decoded
// RESP2 reply: string, int64, nil, []any, or an error for an error reply.
// Enough for the few checks the suite reads from Redis directly.
func redisDo(addr string, args ...string) (any, error) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return nil, err
	}
	return readReply(bufio.NewReader(conn))
}

func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, errors.New(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n < 0 {
			return nil, err
		}
		items := make([]any, n)
		for i := range items {
			if items[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return items, nil
	}
	return nil, fmt.Errorf("unknown reply type %q", line)
}

// redisInt runs a command whose reply is an integer, or an array whose first
// element is one (XPENDING's summary).
func redisInt(t *testing.T, addr string, args ...string) int64 {
	t.Helper()
	reply, err := redisDo(addr, args...)
	if err != nil {
		t.Fatalf("redis %v: %v", args, err)
	}
	switch v := reply.(type) {
	case int64:
		return v
	case []any:
		if len(v) > 0 {
			if n, ok := v[0].(int64); ok {
				return n
			}
		}
	}
	t.Fatalf("redis %v: unexpected reply %#v", args, reply)
	return 0
}

// withTimeout is a context for one step of a test.
func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
