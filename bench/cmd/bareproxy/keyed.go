package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"sync"
)

// maxKeyedBody bounds the body the keyed proxy holds in memory.
const maxKeyedBody = 1 << 20

// keyedProxy is the least a proxy must do to keep the Idempotency-Key contract in one
// process, written plainly on net/http: it reads a keyed request's body into memory,
// fingerprints it with SHA-256, claims the key (scoped by the Authorization header) in a
// map under a mutex, forwards the request with its body in memory, copies the answer as
// it passes and keeps it for the key. A retry of a done key is answered from the map
// (with Idempotent-Replayed: true, as the gateway answers it), a key in flight 409, a
// key reused with another body 422; an answer of 500 or more (the proxy's own 502 among
// them) releases the key.
//
// It is a yardstick, not a product: nothing survives the process, nothing expires, no
// lease, no deadline, no metrics. bench/run.sh puts it beside the bare proxy and the
// gateway, so that what the contract's work costs when written plainly is told apart
// from what the gateway adds to it.
type keyedProxy struct {
	rp *httputil.ReverseProxy

	mu   sync.Mutex
	keys map[string]*keyedEntry
}

type keyedEntry struct {
	fp     [sha256.Size]byte
	done   bool
	status int
	header http.Header
	body   []byte
}

func newKeyedProxy(rp *httputil.ReverseProxy) *keyedProxy {
	rewrite := rp.Rewrite
	rp.Rewrite = func(pr *httputil.ProxyRequest) {
		rewrite(pr)
		// The body is in memory: a reader of it from GetBody lets the transport send it
		// in the same write as the headers.
		if pr.Out.GetBody != nil {
			if b, err := pr.Out.GetBody(); err == nil {
				pr.Out.Body = b
			}
		}
	}
	return &keyedProxy{rp: rp, keys: map[string]*keyedEntry{}}
}

func (p *keyedProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" || r.Method != http.MethodPost {
		p.rp.ServeHTTP(w, r)
		return
	}
	body, err := readKeyedBody(w, r)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "could not read the request body", http.StatusBadRequest)
		return
	}
	fp := sha256.Sum256(body)
	id := r.Header.Get("Authorization") + "\x00" + key

	p.mu.Lock()
	if e := p.keys[id]; e != nil {
		done, same := e.done, e.fp == fp
		p.mu.Unlock()
		switch {
		case !same:
			http.Error(w, "idempotency key reused with another request", http.StatusUnprocessableEntity)
		case !done:
			http.Error(w, "a request with this idempotency key is in progress", http.StatusConflict)
		default:
			// A done entry is never written again: read without the lock.
			h := w.Header()
			for k, v := range e.header {
				h[k] = v
			}
			h.Set("Idempotent-Replayed", "true")
			w.WriteHeader(e.status)
			_, _ = w.Write(e.body)
		}
		return
	}
	e := &keyedEntry{fp: fp}
	p.keys[id] = e
	p.mu.Unlock()

	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	c := &capture{ResponseWriter: w}
	p.rp.ServeHTTP(c, r)

	p.mu.Lock()
	defer p.mu.Unlock()
	if c.status == 0 || c.status >= 500 {
		delete(p.keys, id)
		return
	}
	e.status, e.header, e.body, e.done = c.status, c.header, c.body.Bytes(), true
}

// readKeyedBody reads r's body whole, at most maxKeyedBody bytes.
func readKeyedBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > maxKeyedBody {
		return nil, &http.MaxBytesError{Limit: maxKeyedBody}
	}
	if r.ContentLength > 0 {
		body := make([]byte, r.ContentLength)
		_, err := io.ReadFull(r.Body, body)
		return body, err
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, maxKeyedBody))
}

// capture passes an answer to the client and keeps a copy of it.
type capture struct {
	http.ResponseWriter
	status int
	header http.Header
	body   bytes.Buffer
}

func (c *capture) WriteHeader(code int) {
	if c.status == 0 && code >= 200 {
		c.status, c.header = code, c.ResponseWriter.Header().Clone()
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *capture) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	c.body.Write(b)
	return c.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController (the proxy's flushes) reach the server's writer.
func (c *capture) Unwrap() http.ResponseWriter { return c.ResponseWriter }
