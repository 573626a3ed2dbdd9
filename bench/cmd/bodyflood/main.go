// Command bodyflood sends many keyed requests with large (or slowly sent) bodies at
// once, to measure what a gateway holds in memory and whether it cuts slow senders. It
// can run the upstream itself: one that reads the body, waits, and answers 201.
//
//	bodyflood --upstream-listen 127.0.0.1:3000 --upstream-delay 2s &   # the upstream only
//	bodyflood --url http://127.0.0.1:8080/upload --clients 600 --size 1MiB
//	bodyflood --url http://127.0.0.1:8080/upload --clients 1500 --size 64 --byte-every 1s
//
// It prints the answers by status and how long the slowest took.
package main

import (
	"bufio"
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
	"time"
)

func main() {
	var (
		target    = flag.String("url", "", "the URL to POST to (the gateway)")
		clients   = flag.Int("clients", 600, "requests sent at once, each with its own key")
		size      = flag.Int("size", 1<<20, "body bytes per request")
		byteEvery = flag.Duration("byte-every", 0, "send the body one byte per this interval (0: at once)")
		listen    = flag.String("upstream-listen", "", "serve the upstream on this address instead")
		delay     = flag.Duration("upstream-delay", 2*time.Second, "how long the upstream holds each request")
		timeout   = flag.Duration("timeout", 5*time.Minute, "give up on a request after this long")
	)
	flag.Parse()
	if *listen != "" {
		log.Fatal(http.ListenAndServe(*listen, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			time.Sleep(*delay)
			w.WriteHeader(http.StatusCreated)
		})))
	}
	u, err := url.Parse(*target)
	if err != nil || u.Host == "" {
		fmt.Fprintln(os.Stderr, "bodyflood: --url is required (http://host:port/path)")
		os.Exit(2)
	}
	body := strings.Repeat("x", *size)
	var mu sync.Mutex
	byStatus := map[string]int{}
	var slowest time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for i := range *clients {
		wg.Go(func() {
			t0 := time.Now()
			st := send(u, fmt.Sprintf("flood-%d-%d", start.UnixNano(), i), body, *byteEvery, *timeout)
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
		fmt.Printf("%-24s %d\n", k, byStatus[k])
	}
	fmt.Printf("slowest %s, all in %s\n", slowest.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// send writes one request on its own connection, the body at once or byte by byte, and
// returns the status of the answer (or what went wrong).
func send(u *url.URL, key, body string, every, timeout time.Duration) string {
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
			answered <- "no answer"
			return
		}
		_, _ = io.Copy(io.Discard, res.Body)
		answered <- strconv.Itoa(res.StatusCode)
	}()
	if _, err := io.WriteString(c, head); err != nil {
		return "write error"
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
				return "write error"
			}
		}
	}
	return <-answered
}
