package jetstream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/retrysafe/retrysafe/harness/natscluster"
	"github.com/retrysafe/retrysafe/redeliver"
)

// runCounter counts, per message index, the handler's runs that failed and those that
// completed (returned nil).
type runCounter struct {
	mu        sync.Mutex
	failed    map[int]int
	completed map[int]int
	// untrue lists the runs of messages not yet completed whose Attempt was not the
	// message's failed runs + 1.
	untrue []string
	// rerunFirst counts the runs of completed messages (delivered again: the server lost
	// their acknowledgements) numbered attempt 1 after a failed run: the failure record
	// goes with the acknowledgement, so such a duplicate starts over (see the package
	// documentation, "Attempt counting"; the inbox keeps it from running at all).
	rerunFirst int
}

func newRunCounter() *runCounter {
	return &runCounter{failed: map[int]int{}, completed: map[int]int{}}
}

// handle fails the first run of every fifth message and completes every other run.
func (rc *runCounter) handle(_ context.Context, m *redeliver.Message) error {
	var i int
	if _, err := fmt.Sscanf(m.ID, "m-%d", &i); err != nil {
		return redeliver.Decode(fmt.Errorf("unexpected message %q", m.ID))
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	switch {
	case rc.completed[i] > 0 && m.Attempt == 1:
		if rc.failed[i] > 0 {
			rc.rerunFirst++
		}
	case m.Attempt != rc.failed[i]+1:
		rc.untrue = append(rc.untrue, fmt.Sprintf("%s: attempt %d after %d failed runs (delivery %d)",
			m.ID, m.Attempt, rc.failed[i], m.DeliveryCount))
	}
	if i%5 == 0 && rc.failed[i] == 0 && rc.completed[i] == 0 {
		rc.failed[i]++
		return errors.New("first run of every fifth message fails")
	}
	rc.completed[i]++
	return nil
}

func (rc *runCounter) distinct() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.completed)
}

// TestClusterStreamNodeKillNoFalseDeadLetters completes a few hundred messages of an R1
// stream, stops the consumer once their acknowledgements are answered, kills the
// stream's node (SIGKILL) and restarts it: the node may come back holding messages
// whose acknowledgement it had confirmed, below a consumer state that counts them
// delivered. A new consumer then drains the queue, sweeping for orphans whenever
// nothing is pending. No message whose handler completed may end in the DLQ, and every
// message completes or is dead-lettered with the handler's failed runs of it as its
// attempts.
func TestClusterStreamNodeKillNoFalseDeadLetters(t *testing.T) {
	c := natscluster.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := clusterConfig(c)
	cfg.Replicas = 1
	cfg.AckWait = 2 * time.Second
	cfg.SweepInterval = -1 // the test sweeps
	if err := Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	const total = 600
	flow(t, c, cfg, 0, total)
	names, err := cfg.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	node := c.StreamLeader(names.Stream)
	rc := newRunCounter()
	tweak := func(r *redeliver.Config) { r.Concurrency = 10 }
	first := run(t, cfg, rc.handle, tweak)
	eventually(t, time.Minute, "400 messages to complete", func() bool { return rc.distinct() >= 400 })
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	// The node confirmed every acknowledgement; kill it once it has written the
	// consumer's state (its ack floor) to disk, before it writes the removals from the
	// stream, as a crash between the two does.
	awaitConsumerSaved(t, c.Nodes()[node].StoreDir, names.Stream, names.Consumer, stopped)
	c.Kill(node)
	c.Restart(node)
	c.StreamLeader(names.Stream)

	nc := c.Conn()
	second := run(t, cfg, rc.handle, tweak)
	eventually(t, time.Minute, "the work stream to be empty", func() bool {
		st := queueState(t, nc, cfg)
		if st.ackPending == 0 && st.unpulled == 0 && st.work > 0 {
			if _, err := second.src.Sweep(ctx); err != nil {
				t.Logf("sweep: %v", err)
			}
			st = queueState(t, nc, cfg)
		}
		return st.work == 0 && st.ackPending == 0 && st.unpulled == 0
	})
	if err := second.stop(); err != nil {
		t.Fatal(err)
	}

	dl := deadLetters(t, cfg)
	dead, err := dl.List(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	falseDead, spent := 0, 0
	for _, d := range dead {
		var i int
		if _, err := fmt.Sscanf(d.Message.ID, "m-%d", &i); err != nil {
			t.Errorf("dead letter %q is not a message of the test", d.Message.ID)
			continue
		}
		if rc.completed[i] > 0 {
			if falseDead++; falseDead <= 3 {
				t.Errorf("%s completed %d times, dead-lettered: %+v", d.Message.ID, rc.completed[i], d.Info)
			}
		} else if d.Info.Attempts < rc.failed[i] {
			t.Errorf("%s dead-lettered with attempts %d, its handler failed %d times: %+v",
				d.Message.ID, d.Info.Attempts, rc.failed[i], d.Info)
		} else if d.Info.Attempts != rc.failed[i] {
			// Attempts are the failed runs the failure bucket counted, never the
			// server's deliveries, which a restart spends without a handler run.
			spent++
			t.Errorf("%s dead-lettered with attempts %d, its handler failed %d times: %s: %s",
				d.Message.ID, d.Info.Attempts, rc.failed[i], d.Info.Reason, d.Info.Err)
		}
	}
	if falseDead > 0 {
		t.Errorf("%d of %d dead letters are messages whose handler completed", falseDead, len(dead))
	}
	if len(rc.untrue) > 0 {
		t.Errorf("%d runs with an attempt number other than the message's failed runs + 1, e.g. %q",
			len(rc.untrue), rc.untrue[:min(len(rc.untrue), 5)])
	}
	reruns := 0
	for i := range total {
		if rc.completed[i] == 0 && !deadHas(dead, i) {
			t.Errorf("m-%05d neither completed nor dead-lettered", i)
		}
		reruns += max(rc.completed[i]-1, 0)
	}
	t.Logf("R1 stream node killed after the consumer stopped: %d dead letters (%d of completed messages, %d with attempts other than its failed runs), %d completed messages ran again (%d of them attempt 1 after a failed run)",
		len(dead), falseDead, spent, reruns, rc.rerunFirst)
}

func deadHas(dead []redeliver.DeadLetter, i int) bool {
	id := fmt.Sprintf("m-%05d", i)
	for _, d := range dead {
		if d.Message.ID == id {
			return true
		}
	}
	return false
}

// awaitConsumerSaved waits until the consumer's state file under a node's store (the
// nats-server 2.9+ layout) was written at or after since. Without such a file it returns
// at once: the test then kills the node at whatever point its writes reached.
func awaitConsumerSaved(t *testing.T, storeDir, stream, consumer string, since time.Time) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(storeDir, "jetstream", "*", "streams", stream, "obs", consumer, "o.dat"))
	if err != nil || len(files) != 1 {
		t.Logf("no consumer state file under %s (%v): killing the node without waiting for it", storeDir, err)
		return
	}
	eventually(t, time.Minute, "the consumer state written after the stop", func() bool {
		fi, err := os.Stat(files[0])
		return err == nil && !fi.ModTime().Before(since)
	})
}
