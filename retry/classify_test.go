package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

var classes = []error{ErrAuth, ErrRateLimited, ErrNotFound, ErrInvalid, ErrPlatform, ErrConflict, ErrCanceled}

// matchesOnly reports whether err matches class and no other class.
func matchesOnly(err, class error) bool {
	for _, c := range classes {
		if errors.Is(err, c) != (c == class) {
			return false
		}
	}
	return true
}

func TestClassifyStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code       int
		retryAfter string
		want       error
		retryable  bool
	}{
		{200, "", nil, false}, {201, "", nil, false}, {204, "", nil, false}, {304, "", nil, false}, {101, "", nil, false},
		{401, "", ErrAuth, false}, {403, "", ErrAuth, false},
		{429, "", ErrRateLimited, true}, {429, "5", ErrRateLimited, true},
		{404, "", ErrNotFound, false}, {410, "", ErrNotFound, false},
		{409, "1", ErrConflict, true}, {409, "", ErrInvalid, false},
		{408, "", ErrPlatform, true},
		{400, "", ErrInvalid, false}, {405, "", ErrInvalid, false}, {413, "", ErrInvalid, false}, {422, "", ErrInvalid, false},
		{500, "", ErrPlatform, true}, {502, "", ErrPlatform, true}, {503, "", ErrPlatform, true}, {503, "2", ErrPlatform, true}, {504, "", ErrPlatform, true},
		{501, "", ErrInvalid, false}, {505, "", ErrInvalid, false},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.code, tc.retryAfter), func(t *testing.T) {
			t.Parallel()
			resp := &http.Response{StatusCode: tc.code, Header: http.Header{}}
			if tc.retryAfter != "" {
				resp.Header.Set("Retry-After", tc.retryAfter)
			}
			err := Classify(resp, nil)
			if tc.want == nil {
				if err != nil {
					t.Errorf("Classify = %v, want nil", err)
				}
				return
			}
			if !matchesOnly(err, tc.want) {
				t.Errorf("Classify = %v, want only %v", err, tc.want)
			}
			if Retryable(err) != tc.retryable {
				t.Errorf("Retryable(%v) = %v", err, !tc.retryable)
			}
			var se *StatusError
			if !errors.As(err, &se) || se.StatusCode != tc.code {
				t.Fatalf("Classify = %#v, want a *StatusError with the status", err)
			}
			wantDelay := time.Duration(0)
			if tc.retryAfter != "" {
				var s int
				fmt.Sscan(tc.retryAfter, &s)
				wantDelay = time.Duration(s) * time.Second
			}
			if d, ok := se.RetryAfter(); d != wantDelay || ok != (wantDelay > 0) {
				t.Errorf("RetryAfter = %v, %v; want %v", d, ok, wantDelay)
			}
		})
	}
}

// timeoutErr is a net.Error that timed out.
type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassifyTransportErrors(t *testing.T) {
	t.Parallel()
	// Real errors from net/http where they are cheap to get.
	refused := func() error {
		_, err := http.Get("http://" + closedAddr(t))
		return err
	}
	unsupported := func() error {
		_, err := (&http.Transport{}).RoundTrip(&http.Request{Method: "GET", URL: mustURL(t, "ftp://example.invalid/"), Header: http.Header{}})
		return err
	}
	badCert := func() error {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		srv.StartTLS()
		defer srv.Close()
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		_, err := (&http.Client{Transport: tr}).Get(srv.URL)
		return err
	}
	deadline := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
		defer cancel()
		<-ctx.Done()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+closedAddr(t), nil)
		_, err := http.DefaultClient.Do(req)
		return err
	}
	tests := []struct {
		name string
		err  func() error
		want error
	}{
		{"refused", refused, ErrPlatform},
		{"refused (syscall)", func() error {
			return &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		}, ErrPlatform},
		{"reset", func() error { return &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)} }, ErrPlatform},
		{"broken pipe", func() error { return fmt.Errorf("write: %w", syscall.EPIPE) }, ErrPlatform},
		{"host unreachable", func() error { return fmt.Errorf("dial: %w", syscall.EHOSTUNREACH) }, ErrPlatform},
		{"EOF", func() error { return io.EOF }, ErrPlatform},
		{"unexpected EOF", func() error { return fmt.Errorf("reading: %w", io.ErrUnexpectedEOF) }, ErrPlatform},
		{"timeout", func() error { return &net.OpError{Op: "read", Err: timeoutErr{}} }, ErrPlatform},
		{"deadline exceeded on a conn", func() error { return &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded} }, ErrPlatform},
		{"context canceled", func() error { return fmt.Errorf("Get: %w", context.Canceled) }, ErrCanceled},
		{"context deadline", deadline, ErrCanceled},
		{"unsupported scheme", unsupported, ErrInvalid},
		{"unknown certificate authority", badCert, ErrInvalid},
		{"anything else", func() error { return errors.New("something odd") }, ErrPlatform},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			raw := tc.err()
			if raw == nil {
				t.Fatal("no error produced")
			}
			err := Classify(nil, raw)
			if !matchesOnly(err, tc.want) {
				t.Errorf("Classify(%v) = %v, want only %v", raw, err, tc.want)
			}
			if !errors.Is(err, raw) {
				t.Errorf("Classify(%v) does not unwrap to the transport error", raw)
			}
			var se *StatusError
			if !errors.As(err, &se) || se.StatusCode != 0 {
				t.Errorf("want a *StatusError without a status, got %#v", err)
			}
		})
	}
}

func TestClassifyNoResponse(t *testing.T) {
	t.Parallel()
	if err := Classify(nil, nil); !matchesOnly(err, ErrPlatform) {
		t.Errorf("Classify(nil, nil) = %v", err)
	}
}

func TestClassifyStatusClassOverride(t *testing.T) {
	t.Parallel()
	ctx := WithStatusClass(context.Background(), 404, nil)
	ctx = WithStatusClass(ctx, 409, ErrPlatform)
	ctx = WithStatusClass(ctx, 404, ErrRateLimited) // a later call wins
	ctx = WithStatusClass(ctx, 500, nil)
	req := httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx)
	for code, want := range map[int]error{404: ErrRateLimited, 409: ErrPlatform, 500: nil, 401: ErrAuth} {
		err := Classify(&http.Response{StatusCode: code, Request: req}, nil)
		if (want == nil) != (err == nil) || (want != nil && !matchesOnly(err, want)) {
			t.Errorf("%d: Classify = %v, want %v", code, err, want)
		}
	}
	if _, ok := statusClassFrom(nil, 404); ok {
		t.Error("nil context has overrides")
	}
}

func TestRetryable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("plain"), true},
		{Permanent(errors.New("x")), false},
		{Permanent(&StatusError{Class: ErrPlatform}), false},
		{fmt.Errorf("wrapped: %w", &StatusError{Class: ErrPlatform}), true},
		{&StatusError{Class: ErrRateLimited}, true},
		{&StatusError{Class: ErrConflict}, true},
		{&StatusError{Class: ErrAuth}, false},
		{&StatusError{Class: ErrNotFound}, false},
		{&StatusError{Class: ErrInvalid}, false},
		{&StatusError{Class: ErrCanceled}, false},
		{ErrCanceled, false},
	}
	for _, tc := range tests {
		if got := Retryable(tc.err); got != tc.want {
			t.Errorf("Retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestStatusErrorMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  *StatusError
		want string
	}{
		{&StatusError{Class: ErrPlatform, StatusCode: 503}, "retry: platform failure: HTTP 503 Service Unavailable"},
		{&StatusError{Class: ErrPlatform, Err: io.EOF}, "retry: platform failure: EOF"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
}

// A failure that would be retried and says the caller's budget is spent is final
// (ErrCanceled); the header changes no other class, and only its true value counts.
func TestClassifyBudgetExhausted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code       int
		value      string // of BudgetExhaustedHeader; "" for none
		retryAfter string
		want       error
	}{
		{504, "?1", "", ErrCanceled},
		{503, " ?1 ", "", ErrCanceled},
		{502, "?1", "", ErrCanceled},
		{408, "?1", "", ErrCanceled},
		{429, "?1", "1", ErrCanceled},
		{409, "?1", "1", ErrCanceled},
		{504, "", "", ErrPlatform},
		{504, "?0", "", ErrPlatform},
		{504, "1", "", ErrPlatform},
		{404, "?1", "", ErrNotFound},
		{401, "?1", "", ErrAuth},
		{422, "?1", "", ErrInvalid},
		{200, "?1", "", nil},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.code, tc.value), func(t *testing.T) {
			t.Parallel()
			resp := &http.Response{StatusCode: tc.code, Header: http.Header{}}
			if tc.value != "" {
				resp.Header.Set(BudgetExhaustedHeader, tc.value)
			}
			if tc.retryAfter != "" {
				resp.Header.Set("Retry-After", tc.retryAfter)
			}
			err := Classify(resp, nil)
			if tc.want == nil {
				if err != nil {
					t.Errorf("Classify = %v, want success", err)
				}
				return
			}
			if !matchesOnly(err, tc.want) {
				t.Errorf("Classify = %v, want only %v", err, tc.want)
			}
			if tc.want == ErrCanceled && (Retryable(err) || !strings.Contains(err.Error(), "budget is spent")) {
				t.Errorf("Classify = %q (retryable %v), want a final error that says why", err, Retryable(err))
			}
		})
	}
	// A class the caller sets for the status wins.
	resp := &http.Response{StatusCode: 504, Header: http.Header{BudgetExhaustedHeader: {"?1"}}}
	resp.Request = httptest.NewRequest(http.MethodGet, "/", nil).WithContext(WithStatusClass(context.Background(), 504, ErrPlatform))
	if err := Classify(resp, nil); !matchesOnly(err, ErrPlatform) {
		t.Errorf("with WithStatusClass(504, ErrPlatform): Classify = %v", err)
	}
}

// An error Transport returned is already classified: Classify returns it as it is, so
// the class is not guessed again and the message does not repeat it.
func TestClassifyKeepsTransportErrors(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hijack(t, w, "", false) }))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &Transport{Base: newBase(t), Policy: testPolicy(newFakeClock())}}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name  string
		do    func() error
		class error
		once  string // appears once in the message
	}{
		{"canceled", func() error {
			_, err := client.Do(newRequest(t, canceled, http.MethodGet, srv.URL, ""))
			return err
		}, ErrCanceled, "retry: canceled"},
		{"refused, retries exhausted", func() error {
			_, err := client.Get("http://" + closedAddr(t))
			return err
		}, ErrPlatform, "retry: platform failure"},
		{"unknown outcome", func() error {
			_, err := client.Post(srv.URL, "text/plain", strings.NewReader("x"))
			return err
		}, ErrPlatform, "retry: platform failure"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.do()
			got := Classify(nil, err)
			if got != err {
				t.Errorf("Classify(nil, %q) = %q, want the error itself", err, got)
			}
			if !matchesOnly(got, tc.class) {
				t.Errorf("Classify = %v, want only %v", got, tc.class)
			}
			if n := strings.Count(got.Error(), tc.once); n != 1 {
				t.Errorf("%q appears %d times in %q", tc.once, n, got.Error())
			}
		})
	}
}
