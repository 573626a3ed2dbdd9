package grpcidem_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/grpc/grpcidem"
	"github.com/retrysafe/retrysafe/idempotency"
	"github.com/retrysafe/retrysafe/storedsn"
	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// serverEnv names the store a server process serves with; holdEnv makes its executions
// hang after they have begun (so that the test can kill the process mid-call).
const (
	serverEnv  = "GRPCIDEM_TEST_SERVER_DSN"
	holdEnv    = "GRPCIDEM_TEST_SERVER_HOLD"
	crashLease = 2 * time.Second
)

// serveProcess is the server process: it prints "ready ADDR", then "exec BODY TOKEN" as
// each execution begins.
func serveProcess(dsn string) int {
	ctx := context.Background()
	o, err := storedsn.Open(ctx, dsn, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := o.Migrate(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ic, err := grpcidem.New(grpcidem.Config{Idempotency: idempotency.Config{Store: o.Store, Lease: crashLease, Conflict: idempotency.ConflictWait}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	s := newSvc()
	hang := os.Getenv(holdEnv) != ""
	out := make(chan string, 16)
	go func() {
		for line := range out {
			fmt.Println(line)
		}
	}()

	g := grpc.NewServer(ic.ServerOptions()...)
	testgrpc.RegisterTestServiceServer(g, &reporting{svc: s, out: out, hang: hang})
	out <- "ready " + ln.Addr().String()
	_ = g.Serve(ln)
	return 0
}

// reporting reports each execution, with its fencing token, before it runs.
type reporting struct {
	*svc
	out  chan<- string
	hang bool
}

func (r *reporting) UnaryCall(ctx context.Context, in *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	var token int64
	if c, ok := idempotency.ClaimFromContext(ctx); ok {
		token = c.Token
	}
	r.out <- fmt.Sprintf("exec %s %d", in.GetPayload().GetBody(), token)
	if r.hang {
		<-ctx.Done() // the process is killed before this returns
		select {}
	}
	return r.svc.UnaryCall(ctx, in)
}

// process is a server process started by the test.
type process struct {
	cmd   *exec.Cmd
	addr  string
	lines chan string
}

func startProcess(t *testing.T, dsn string, hang bool) *process {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serverEnv+"="+dsn)
	if hang {
		cmd.Env = append(cmd.Env, holdEnv+"=1")
	}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, lines: make(chan string, 64)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	line, ok := <-p.lines
	if !ok || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("server process: %q, want ready ADDR", line)
	}
	p.addr = strings.TrimPrefix(line, "ready ")
	return p
}

// next returns the next execution line of the process.
func (p *process) next(ctx context.Context, t *testing.T) (body string, token int64) {
	t.Helper()
	var line string
	var ok bool
	select {
	case line, ok = <-p.lines:
	case <-ctx.Done():
		t.Fatal("no execution reported by the server process")
	}
	if !ok {
		t.Fatal("server process ended")
	}
	if _, err := fmt.Sscanf(line, "exec %s %d", &body, &token); err != nil {
		t.Fatalf("server process said %q: %v", line, err)
	}
	return body, token
}

// TestCrashTakeover: a server process killed mid-call leaves its key in progress; once
// its lease has run out, the retry that reaches another process takes the key over with
// a greater fencing token, runs the call and stores the answer, which later retries get.
func TestCrashTakeover(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"sqlite", "postgres", "redis"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			dsn := storeDSN(t, kind)
			a := startProcess(t, dsn, true)
			ca := dial(t, a.addr)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			lost := make(chan result, 1)
			go func() { lost <- invoke(ctx, ca, "k-crash", "crash", "") }()
			body, tokenA := a.next(ctx, t)
			if body != "crash" {
				t.Fatalf("process A ran %q", body)
			}
			if err := a.cmd.Process.Kill(); err != nil { // SIGKILL: no cleanup of any kind
				t.Fatal(err)
			}
			if r := <-lost; r.err == nil {
				t.Fatalf("the call to the killed process succeeded: %v", r)
			}

			b := startProcess(t, dsn, false)
			cb := dial(t, b.addr)
			var r result
			for attempt := 1; ; attempt++ { // the client's retries: the key is in progress until A's lease ends
				r = invoke(ctx, cb, "k-crash", "crash", "")
				if r.err == nil || ctx.Err() != nil {
					break
				}
				t.Logf("retry %d: %v", attempt, r.err)
			}
			if r.err != nil {
				t.Fatalf("retry after the crash: %v", r.err)
			}
			body, tokenB := b.next(ctx, t)
			if body != "crash" || tokenB <= tokenA {
				t.Fatalf("process B ran %q with token %d, want crash with a token above A's %d", body, tokenB, tokenA)
			}
			again := invoke(ctx, cb, "k-crash", "crash", "")
			if again.err != nil || !again.replayed() || again.String() != r.String() {
				t.Fatalf("a later retry: %v (replayed %v), want %v replayed", again, again.replayed(), r)
			}
			select {
			case line := <-b.lines:
				t.Fatalf("process B ran again: %s", line)
			default:
			}
		})
	}
}
