// Command bodyflood sends many keyed requests with large (or slowly sent) bodies at
// once, to measure what a gateway holds in memory and whether it cuts slow senders. It
// can run the upstream itself: one that reads the body, waits, and answers 201 (with
// --upstream-echo, 201 with the request's body, so that answers are as large as the
// requests), and counts the executions of each key.
//
//	bodyflood --upstream-listen 127.0.0.1:3000 --upstream-delay 2s &   # the upstream only
//	bodyflood --url http://127.0.0.1:8080/upload --clients 600 --size 1MiB
//	bodyflood --url http://127.0.0.1:8080/upload --clients 1500 --size 64 --byte-every 1s
//	bodyflood --url http://127.0.0.1:8080/upload --clients 600 --echo \
//	    --executions http://127.0.0.1:3000/executions --pid "$(pgrep -n retrysafe)"
//
// It prints the answers by status and how long the slowest took; with --echo it checks
// that every 2xx answer carries the request's own body, with --executions how many of
// the run's keys the upstream executed and how many more than once, and with --pid the
// peak resident memory (VmHWM) of that process.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	var (
		target     = flag.String("url", "", "the URL to POST to (the gateway)")
		clients    = flag.Int("clients", 600, "requests sent at once, each with its own key")
		size       = flag.Int("size", 1<<20, "body bytes per request")
		byteEvery  = flag.Duration("byte-every", 0, "send the body one byte per this interval (0: at once)")
		listen     = flag.String("upstream-listen", "", "serve the upstream on this address instead")
		delay      = flag.Duration("upstream-delay", 2*time.Second, "how long the upstream holds each request")
		echo       = flag.Bool("upstream-echo", false, "the upstream answers 201 with the request's body (else with no body)")
		checkEcho  = flag.Bool("echo", false, "check that every 2xx answer's body is the request's own")
		executions = flag.String("executions", "", "the upstream's /executions URL: report how many of this run's keys it executed, and how many more than once")
		pid        = flag.Int("pid", 0, "report this process's peak resident memory (VmHWM) after the run")
		timeout    = flag.Duration("timeout", 5*time.Minute, "give up on a request after this long")
	)
	flag.Parse()
	if *listen != "" {
		log.Fatal(http.ListenAndServe(*listen, newUpstream(*delay, *echo)))
	}
	u, err := url.Parse(*target)
	if err != nil || u.Host == "" {
		fmt.Fprintln(os.Stderr, "bodyflood: --url is required (http://host:port/path)")
		os.Exit(2)
	}
	prefix := fmt.Sprintf("flood-%d-", time.Now().UnixNano())
	var mu sync.Mutex
	byStatus := map[string]int{}
	var slowest time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for i := range *clients {
		wg.Go(func() {
			key := prefix + strconv.Itoa(i)
			// Each body starts with its key, so that an answer carrying another
			// request's body is caught.
			body := key + ":" + strings.Repeat("x", max(0, *size-len(key)-1))
			t0 := time.Now()
			st := send(u, key, body, *byteEvery, *timeout, *checkEcho)
			d := time.Since(t0)
			mu.Lock()
			byStatus[st]++
			slowest = max(slowest, d)
			mu.Unlock()
		})
	}
	wg.Wait()
	keys := make([]string, 0, len(byStatus))
	for k := range byStatus {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("%-40s %d\n", k, byStatus[k])
	}
	fmt.Printf("slowest %s, all in %s\n", slowest.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	if *executions != "" {
		res, err := http.Get(*executions + "?prefix=" + url.QueryEscape(prefix))
		if err != nil {
			log.Fatalf("bodyflood: --executions: %v", err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Printf("upstream: %s\n", strings.TrimSpace(string(b)))
	}
	if *pid != 0 {
		hwm, err := peakRSS(*pid)
		if err != nil {
			log.Fatalf("bodyflood: --pid: %v", err)
		}
		fmt.Printf("peak RSS of %d: %s\n", *pid, hwm)
	}
}

// upstream answers each request after a delay, and counts the executions of each key.
type upstream struct {
	delay time.Duration
	echo  bool
	mu    sync.Mutex
	runs  map[string]int // executions by Idempotency-Key
}

func newUpstream(delay time.Duration, echo bool) *upstream {
	return &upstream{delay: delay, echo: echo, runs: map[string]int{}}
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/executions" {
		prefix := r.URL.Query().Get("prefix")
		keys, runs, twice := 0, 0, 0
		u.mu.Lock()
		for k, n := range u.runs {
			if strings.HasPrefix(k, prefix) {
				keys, runs = keys+1, runs+n
				if n > 1 {
					twice++
				}
			}
		}
		u.mu.Unlock()
		fmt.Fprintf(w, "%d executions of %d keys, %d keys executed more than once\n", runs, keys, twice)
		return
	}
	// Read the whole body before answering: an HTTP/1 handler that writes first may
	// lose the rest of its request body.
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if k := r.Header.Get("Idempotency-Key"); k != "" {
		u.mu.Lock()
		u.runs[k]++
		u.mu.Unlock()
	}
	time.Sleep(u.delay)
	if !u.echo {
		w.WriteHeader(http.StatusCreated)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

// send writes one request on its own connection, the body at once or byte by byte, and
// returns the status of the answer (or what went wrong).
func send(u *url.URL, key, body string, every, timeout time.Duration, checkEcho bool) string {
	c, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
	if err != nil {
		return "dial error"
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nIdempotency-Key: %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n",
		u.RequestURI(), u.Host, key, len(body))
	answered := make(chan string, 1)
	go func() {
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			answered <- "no answer: " + errKind(err)
			return
		}
		got, err := io.ReadAll(res.Body)
		st := strconv.Itoa(res.StatusCode)
		switch {
		case err != nil:
			st += " body cut: " + errKind(err)
		case checkEcho && res.StatusCode/100 == 2 && !bytes.Equal(got, []byte(body)):
			st += " wrong body"
		}
		answered <- st
	}()
	if _, err := io.WriteString(c, head); err != nil {
		return "write error: " + errKind(err)
	}
	if every == 0 {
		_, _ = io.WriteString(c, body)
	} else {
		for i := 0; i < len(body); i++ {
			select {
			case st := <-answered:
				return st + " (cut while sending)"
			case <-time.After(every):
			}
			if _, err := c.Write([]byte{body[i]}); err != nil {
				return "write error: " + errKind(err)
			}
		}
	}
	return <-answered
}

// errKind names a connection error briefly.
func errKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "closed"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return err.Error()
}

// peakRSS returns the VmHWM line of /proc/PID/status.
func peakRSS(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("%d MiB", kb/1024), nil
		}
	}
	return "", errors.New("no VmHWM in /proc/PID/status")
}
