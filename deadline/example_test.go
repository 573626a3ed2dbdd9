package deadline_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/retrysafe/retrysafe/deadline"
)

// The middleware gives each request the smaller of the caller's budget and the
// server's, refuses work when the caller has no time left, and answers 504 for a handler
// that gives up at its deadline without a word. Both 504s say that the caller's budget
// is spent (Request-Budget-Exhausted), so a client does not resend.
func ExampleMiddleware() {
	handler := deadline.Middleware(deadline.Config{Budget: 10 * time.Second})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			left, _ := deadline.Remaining(r.Context())
			fmt.Println("handler runs, with at most 250ms:", left <= 250*time.Millisecond)
			if r.URL.Path == "/slow" {
				<-r.Context().Done() // the work takes longer than the budget: give up
			}
		}))

	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Request-Budget-Ms", "250") // the caller has 250ms left
	handler.ServeHTTP(httptest.NewRecorder(), r)

	r = httptest.NewRequest(http.MethodGet, "/slow", nil)
	r.Header.Set("Request-Budget-Ms", "20")
	w := httptest.NewRecorder()
	handler.ServeHTTP(w, r)
	fmt.Println(w.Code, w.Header().Get("Content-Type"), w.Header().Get(deadline.ExhaustedHeader))

	r.Header.Set("Request-Budget-Ms", "0") // the caller's budget is spent
	w = httptest.NewRecorder()
	handler.ServeHTTP(w, r)
	fmt.Println(w.Code, w.Header().Get("Content-Type"), w.Header().Get(deadline.ExhaustedHeader))
	// Output:
	// handler runs, with at most 250ms: true
	// handler runs, with at most 250ms: true
	// 504 application/problem+json ?1
	// 504 application/problem+json ?1
}

// Transport tells the next hop how long it has: the time left in the request's
// context, minus a reserve for the hop itself. Under a retry layer, put it below:
//
//	&retry.Transport{Base: deadline.Transport{Reserve: 50 * time.Millisecond}}
//
// so that every attempt carries the budget left when it is sent.
func ExampleTransport() {
	next := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.Header.Get("Request-Budget-Ms"))
		fmt.Println("next hop's budget between 5s and 9.5s:", ms > 5000 && ms <= 9500)
	}))
	defer next.Close()
	client := &http.Client{Transport: deadline.Transport{
		Base:    next.Client().Transport,
		Reserve: 500 * time.Millisecond,
	}}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, next.URL, nil)
	if resp, err := client.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	// With less time left than the reserve, nothing is sent.
	short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancelShort()
	req, _ = http.NewRequestWithContext(short, http.MethodGet, next.URL, nil)
	_, err := client.Do(req)
	fmt.Println("failed fast:", errors.Is(err, context.DeadlineExceeded))
	// Output:
	// next hop's budget between 5s and 9.5s: true
	// failed fast: true
}

// Reserve keeps time back for the database write that must follow a slow call.
func ExampleReserve() {
	requestDeadline := time.Now().Add(15 * time.Second)
	ctx, cancel := context.WithDeadline(context.Background(), requestDeadline)
	defer cancel()

	callCtx, cancelCall := deadline.Reserve(ctx, 2*time.Second) // 2s for the write after
	defer cancelCall()
	callDeadline, _ := callCtx.Deadline()
	fmt.Println("the call must end", requestDeadline.Sub(callDeadline), "before the request")

	// Asking for more than is left gives a context that is already done.
	tooMuch, cancelTooMuch := deadline.Reserve(ctx, time.Minute)
	defer cancelTooMuch()
	fmt.Println(tooMuch.Err())
	// Output:
	// the call must end 2s before the request
	// context deadline exceeded
}

// Ladder is an AI-provider ladder inside one budget: each provider gets at most PerStep,
// the first answer wins, and the whole never outlasts the request. When every provider
// fails, the error names each, on one line.
func ExampleLadder() {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	primary := func(ctx context.Context) (string, error) {
		<-ctx.Done() // hangs: cut after PerStep
		return "", ctx.Err()
	}
	fallback := func(ctx context.Context) (string, error) { return "answer from the fallback", nil }
	last := func(ctx context.Context) (string, error) { return "never asked", nil }

	answer, err := deadline.Ladder(ctx, deadline.LadderConfig{
		PerStep: 20 * time.Millisecond, // real code: seconds, a share of the request's budget
		MinStep: 10 * time.Millisecond, // not worth starting a provider with less
	}, primary, fallback, last)
	fmt.Println(answer, err)

	broken := func(context.Context) (string, error) { return "", errors.New("503") }
	_, err = deadline.Ladder(ctx, deadline.LadderConfig{}, broken, broken)
	fmt.Println(err)
	// Output:
	// answer from the fallback <nil>
	// deadline: ladder step 0: 503; deadline: ladder step 1: 503
}
