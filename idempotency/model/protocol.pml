/*
 * protocol.pml: the claim / lease / heartbeat / completion / release / abandon /
 * takeover protocol of package idempotency, as a Promela model for spin.
 *
 * One key (one scope, one fingerprint) on one store shared by NREP replicas. NATT
 * client attempts carrying the key arrive at any replica at any time, concurrently or
 * one after the other (duplicates and retries). Owners crash; a replica's process
 * restarts (every attempt on it crashes, and the new process knows nothing of the
 * store's past); each replica's link to
 * the store goes down and up; a call over a link that is down fails, or is applied with
 * its reply lost, or is held by the network and delivered later or never, or is applied
 * and delivered again later (a client library resending it); answers to the client are
 * lost. The store decides leases with its own clock; the replicas' clocks are offset
 * from it (only where the code reads an instant of a replica's clock does an offset
 * matter: LOCAL_CLOCK below is that mistake).
 *
 * The store is a primary and its standby. A write the store acknowledges is durable:
 * the standby has it, and every write before it (synchronous replication: PostgreSQL's
 * commit returned without warning, Redis's WAIT reported the replicas). A write whose
 * outcome is unknown (its reply lost, an error) may be applied on the primary only: it
 * reaches the standby later or never. Reads are answered by the primary. A failover
 * (MAXFAILOVER, a fault) replaces the primary's record by the standby's, token counter
 * included. So the protocol acts only on acknowledged writes: a completion whose outcome
 * is unknown is held and resent until one is acknowledged (Complete is idempotent per
 * token), never confirmed by reading the record back (BROKEN_CONFIRM_BY_READ); a claim
 * carries the claimer's ID, and one that finds its own in-progress record is granted it
 * with a write; a claim whose outcome is unknown is answered 503, not executed, and
 * taken back in the background (the unclaim: the claim resent with its ID, never taking
 * anything over, and the key released if it is granted). Claims refused while the store
 * cannot make writes durable (fail fast) are not modelled: a refusal changes nothing in
 * the store, and is an attempt that did not come.
 *
 * Time is discrete: one tick is a third of a lease (L ticks), the heartbeat period. No
 * instant is stored, only what is left of a duration or how long ago something was
 * (saturated), so the state space is finite with no horizon: the model is checked for
 * runs of any length.
 *
 * Transition (model)   Go (package idempotency; file: function)
 * --------------------  ------------------------------------------------------------
 * storeClaim            memstore/memstore.go: Store.Claim
 *                       pgstore/pgstore.go: Store.Claim, claimable
 *                       redisstore/redisstore.go: Store.Claim
 *                       store.go: ClaimRequest.MayTakeOver, ClaimRequest.TakeoverLimit
 *   (the claim ID, field ClaimRequest.ID: a claim is granted its own in-progress record)
 * storeExtend           memstore/memstore.go: Store.Extend
 * storeComplete         memstore/memstore.go: Store.Complete
 * storeRelease          memstore/memstore.go: Store.Release
 * storeAbandon          memstore/memstore.go: Store.Abandon
 * storeGet              memstore/memstore.go: Store.Get
 *   (only the former read-back reads it: BROKEN_CONFIRM_BY_READ)
 * FAULTY (a call)       middleware.go: Middleware.storeCall
 *                       health.go: health.observe
 * Attempt: claim        middleware.go: Middleware.serve, Middleware.claim
 *   (first claim with NoTakeover; the decision; the takeover claim with TakeoverBy)
 *                       health.go: health.takeoverWait
 * Attempt: unclaim      durable.go: Middleware.unclaim, Middleware.retryStore
 *   (a claim's outcome unknown: 503; the claim resent with its ID and NoTakeover until
 *   answered; granted, the key released with its token until acknowledged or lost)
 * Attempt: existing     middleware.go: Middleware.existing
 * Attempt: held answer  pending.go: Middleware.pendingFor
 *                       middleware.go: Middleware.answerHeld
 * Attempt: renew        heartbeat.go: execution.startHeartbeat, execution.renew
 * Attempt: returns      claim.go: Middleware.execute
 *                       heartbeat.go: execution.stopHeartbeat
 * Attempt: finish       claim.go: Middleware.execute, Middleware.finish
 *                       claim.go: Middleware.release, Middleware.abandon
 *                       pending.go: Middleware.holdPending
 * Attempt: flush        pending.go: Middleware.flush, Middleware.dropPending
 *   (Complete resent until acknowledged or lease lost; no read-back)
 * Clock: tick           health.go: Middleware.probe
 *   (the store's clock; a replica whose link is down at a tick has seen the store
 *   fail: its probe pings every third of a lease)
 * Janitor (EXPIRY)      janitor.go: RunJanitor, Sweep
 *                       memstore/memstore.go: Store.DeleteExpired
 * Restart               health.go: newHealth, health.settling, health.startWait
 *                       middleware.go: Middleware.claim
 *   (a replica's process dies, every attempt on it crashes; the new process's health
 *   starts as if it had just seen the store fail: no takeover for a lease)
 * Links, Net            the network between the replicas and the store
 * Store: replicate,     the store's replication and failover (PostgreSQL's synchronous
 *   failover            standby, Redis's WAIT): no Go code; a write's acknowledgement
 *                       (DURABLE) is the store call's answer without error
 * Final                 a retry once every fault is over (the progress check)
 *
 * State (store.go)      model
 * StateInProgress       state in_progress
 * StateDone             state done
 * (no record)           state absent: ErrNotFound, not a Go State
 *
 * Outcome (middleware.go)  model
 * OutcomeExecuted       outcome executed
 * OutcomeStoredLater    outcome stored_later
 * OutcomeReplayed       outcome replayed
 * OutcomeConflict       outcome conflict
 * OutcomeStoreError     outcome store_error
 * OutcomeReleased       outcome released
 * OutcomeAbandoned      outcome abandoned
 * OutcomeLeaseLost      outcome lease_lost
 * OutcomeDoneAborted    not modelled: a completed record whose answer broke off is a
 *                       completion (executed) whose answer to the client was lost
 * OutcomeClientGone     not modelled: a release (released) nobody reads
 * OutcomePassThrough    not modelled: decided before the store is called (no key)
 * OutcomeMismatch       not modelled: the model has one fingerprint
 * OutcomeMissingKey     not modelled: decided before the store is called
 * OutcomeInvalidKey     not modelled: decided before the store is called
 * OutcomeInvalidMethod  not modelled: decided before the store is called
 * OutcomeTooLarge       not modelled: decided before the store is called
 * OutcomeBadBody        not modelled: decided before the store is called
 * OutcomeBodyTimeout    not modelled: decided before the store is called
 * OutcomeOverloaded     not modelled: decided before the store is called
 * OutcomeDeadline       not modelled: decided before the store is called
 * OutcomeFailedOpen     not modelled: FailOpen gives up the guarantees by choice
 * OutcomeNotDurable     not modelled: a refusal before the store is called, while the
 *                       store says it cannot make writes durable; a claim it refuses
 *                       after the call is store_error (its outcome unknown, unclaimed)
 *
 * Invariants (each an assertion, named by an mtype inv_*; -DONLY=inv_x keeps one):
 * inv_once      every upstream execution but the first follows a documented window:
 *               an owner that crashed (by itself, or with its replica's restart) after
 *               its upstream call and before its answer reached the store (winCrash),
 *               an abandoned (unknown) outcome (winAband), or a takeover of a live owner
 *               whose replica could not reach the store until its lease ran out, by a
 *               replica that had reached it for a whole lease (winCut): the owner need
 *               only be cut off for the rest of its lease, two thirds of a lease or
 *               more after a renewal, and a held answer's owner renews nothing. Both
 *               sides of winCut are judged on the links' real history (the ghost
 *               linkUp), which a restart does not reset, not on a process's health
 * inv_takeover  a live owner's key is taken over only in that last window
 * inv_replay    a replay (from the store, or from a response held by a replica) is the
 *               response stored for the key; a held one may differ only after winCut or
 *               a crash that lost a held answer (respWin)
 * inv_final     every answer the client takes as final is the same, and is the one the
 *               store keeps (and replays), but after respWin
 * inv_token     a claim's token is greater than the token of the record it replaces
 * inv_stale     a completion is stored only for the current owner (a stale owner's is
 *               rejected)
 * inv_progress  once every attempt is over, no message is in flight and every link has
 *               been up for a lease with no restart or failover, a retry claims the key
 *               or replays it: no record stays in progress with no owner
 * inv_unclaim   an unclaim that ends on the store's answer to its resent claim leaves no
 *               in-progress record of its claim ID on the store: a claim answered "not
 *               executed" blocks its key no longer than until the store answers again
 *
 * Broken variants (-D...), each of which spin must refute:
 * BROKEN_TAKEOVER_SAME_TOKEN  a takeover keeps the old token            (inv_token)
 * BROKEN_NO_TOKEN_CHECK       Complete does not check the token         (inv_stale)
 * BROKEN_CLAIM_LIVE_LEASE     the store takes over a running lease      (inv_once)
 * BROKEN_EXTEND_NOOP          Extend does not move the lease            (inv_takeover)
 * BROKEN_NO_TAKEOVERBY        no TakeoverBy bound on the second claim   (inv_once)
 * BROKEN_NO_HEALTH_HOLD       takeovers right after the store failed    (inv_final)
 * BROKEN_LOCAL_CLOCK          leases on the callers' clocks, skew S     (inv_takeover)
 * BROKEN_SEND_BEFORE_STORE    the answer is sent before it is stored    (inv_final)
 * BROKEN_RELEASE_NO_CHECK     Release deletes whatever record is there  (inv_once)
 * BROKEN_CLAIM_REPLACES_DONE  a claim replaces a done record            (inv_replay)
 * BROKEN_NO_TAKEOVER          the middleware never sends the takeover   (inv_progress)
 * BROKEN_START_HEALTHY        a restarted process presumes the store healthy (inv_once)
 * BROKEN_CONFIRM_BY_READ      a completion confirmed by reading it back  (inv_once)
 *                             (the former Middleware.storedByUs, with a Complete that
 *                             refuses a record already done under its token)
 * BROKEN_REGRANT_READ         a claim granted its own record by a read   (inv_once)
 * BROKEN_CLAIM_ID_IGNORED     a resent claim does not know its own record (inv_unclaim)
 *
 * EXPIRY adds the TTL (L+1 ticks) and the janitor, and with them two windows: a key
 * whose TTL is over runs again (winTTL, by design), and an outage of every replica that
 * outlasts a record's TTL while its request runs lets the janitor delete the record
 * before its owner stores (winOutage). With -DSTRICT_TTL the second is not excused:
 * spin finds it in a janitor not held back (RunJanitor without JanitorConfig.Middleware),
 * and JANITOR_HELD_BACK (the gateway's janitor, held back by its middleware) or
 * JANITOR_DONE_ONLY close it (the model verifies with either).
 *
 * The windows are real: with -DSTRICT inv_once allows no second execution, and spin
 * finds one in each window alone (an owner crash with no outage and no unknown outcome,
 * -DMAXOUT=0 -DMAXHELD=0 -DMAXRESTART=0 -DNO_ABANDON; a restart, with no other fault,
 * -DMAXCRASH=0 -DMAXOUT=0 -DMAXHELD=0 -DNO_ABANDON; an unknown outcome with no other
 * fault, -DMAXCRASH=0 -DMAXOUT=0 -DMAXHELD=0 -DMAXRESTART=0; an owner cut off, with no
 * crash, restart or unknown outcome, -DMAXCRASH=0 -DMAXRESTART=0 -DNO_ABANDON), and none
 * with no fault and no unknown outcome (each with -DMAXFAILOVER=0).
 *
 * ASYNC makes the standby asynchronous: an acknowledged write need not be on it, and a
 * failover can lose the last acknowledged writes (a setup the documentation warns of):
 * their keys may run again, more than once, as a token issued in a lost write may be
 * issued again and its old owner's calls then act on the new owner's record. The window
 * (asyncLost) excuses every invariant but inv_token, inv_progress and inv_unclaim for
 * the key; -DSTRICT_ASYNC (or -DSTRICT) does not excuse it, and spin finds a second
 * execution after a failover with no other fault (-DASYNC -DSTRICT -DMAXCRASH=0
 * -DMAXOUT=0 -DMAXHELD=0 -DMAXRESTART=0 -DNO_ABANDON), and none with the same bound
 * and synchronous replication. With synchronous replication there is no new window: a
 * failover loses only writes nobody was told of, and their writers act as on any
 * unknown outcome.
 *
 * Assumed of a restart (MAXRESTART, a fault like the others, bounded): the old process
 * dies and the new one starts at one instant; a downtime between them is time in which
 * the replica serves nothing, which needs no transition (no attempt need arrive). The
 * new process's health starts as if it had just seen the store fail, and counts the
 * lease from its start; the Go code counts it from its first claim, on the store's clock
 * (health.settling), which is no earlier, so the model takes over at least as soon as
 * the code may, and the code's takeovers are among those it checks. What the old
 * process held in memory (its held answers, its health) is lost; what it sent and the
 * network holds may still arrive.
 *
 * Assumed of a failover: it is one instant (calls that fail during it are an outage of
 * their links), and a replica need not see it (its calls go to the new primary). The
 * standby holds the primary's latest state as of some instant since its last
 * acknowledged write: any prefix of the writes since, as a replication log does. A
 * token issued in a write the failover lost may be issued again (a sequence, a clock,
 * taken back): with synchronous replication nobody holds one, as every token the
 * protocol uses came in an acknowledged write (a claim granted, or its own record
 * granted with a write). The store does not restart otherwise.
 */

#ifndef NATT
#define NATT 2          /* client attempts (and a final retry: see Final) */
#endif
#define NREP 2          /* replicas */
#define L 3             /* lease, in ticks; a tick is the heartbeat period, a third of it */
#define F 1             /* freshness of a takeover decision: TakeoverBy = res.Now + L/3 */
#ifndef MAXCRASH
#define MAXCRASH 1      /* owner crashes */
#endif
#ifndef MAXOUT
#define MAXOUT 2        /* link outages (a link going down) */
#endif
#ifndef MAXHELD
#define MAXHELD 1       /* store calls held by the network (delivered late or never) */
#endif
#ifndef MAXRESTART
#define MAXRESTART 1    /* replica (process) restarts */
#endif
#ifndef MAXFAILOVER
#define MAXFAILOVER 1   /* store failovers (the primary replaced by its standby) */
#endif
#ifndef S
#define S 2             /* clock skew bound, in ticks (only LOCAL_CLOCK reads it) */
#endif
#define FINAL (NATT + 1)

/* EXPIRY adds the record's expiry (a TTL of L+1 ticks, longer than the lease) and the
 * janitor; without it a record outlives every run. */
#ifdef EXPIRY
#define TTL (L + 1)
#define SET_EXP expLeft = TTL
#define EXTEND_EXP if :: expLeft < leaseLeft -> expLeft = leaseLeft :: else -> skip fi
#define TICK_EXP if :: st != absent && expLeft > 0 -> expLeft-- :: else -> skip fi
#define CLEAR_EXP expLeft = 0
#define WIN_TTL (winTTL + winOutage)
#define D_EXP dExp = expLeft
#define P_EXP expLeft = dExp
#define SAME_EXP (dExp == expLeft)
#define TICK_DEXP if :: dst != absent && dExp > 0 -> dExp-- :: else -> skip fi
#else
#define SET_EXP skip
#define EXTEND_EXP skip
#define TICK_EXP skip
#define CLEAR_EXP skip
#define WIN_TTL 0
#define D_EXP skip
#define P_EXP skip
#define SAME_EXP true
#define TICK_DEXP skip
#endif

#ifdef BROKEN_LOCAL_CLOCK
#define LMIN (-S)
#define CLK(i) off[i]
#define QUIET (L + S)
#else
#define LMIN 0
#define CLK(i) 0
#define QUIET L
#endif

mtype:state = { absent, in_progress, done };
mtype:outcome = { executed, stored_later, replayed, conflict, store_error, released, abandoned, lease_lost };
mtype:res = { r_ok, r_lost, r_err, r_claimed, r_existing };
mtype:opcode = { op_none, op_claim, op_extend, op_complete, op_release, op_abandon };
mtype:inv = { inv_once, inv_takeover, inv_replay, inv_final, inv_token, inv_stale, inv_progress, inv_unclaim };

#ifdef ONLY
#define ON(which) (which == ONLY)
#else
#define ON(which) true
#endif
/* hidden: not part of the state; they only name what a trail prints */
hidden mtype:inv violated;
hidden mtype:outcome reported;
/* CHECK is an if with an else: it must not begin an option of another if, whose other
 * options would then stand in for its guards (the else would never be taken). */
#define CHECK(c, which) if :: ON(which) && !(c) -> violated = which; printf("MODEL-VIOLATION %e\n", violated); assert(false) :: else -> skip fi

/* The store's primary: one record. */
mtype:state st = absent;
byte tok;               /* the record's fencing token */
byte ctr;               /* the last token issued (a failover may take it back: a token
                         * issued in a write the failover lost may be issued again) */
short leaseLeft;        /* LeaseUntil - now, saturated at LMIN; 0 while not in progress */
bool recAband;          /* Record.Abandoned */
byte owner;             /* the claim ID of the record's claimer: the attempt that claimed
                         * its token (ClaimRequest.ID) */
#ifdef EXPIRY
short expLeft;          /* ExpiresAt - now, saturated at 0 */
byte winTTL;            /* records gone with their TTL: a retry then runs again, by design */
byte winOutage;         /* a live owner's record deleted after an outage outlasting its TTL */
#endif
byte resp;              /* the stored response (the id of the attempt that made it) */

/* The store's standby: the durable copy of the record, the one a failover keeps. A write
 * the store acknowledges is on it (synchronous replication: the acknowledgement waits
 * for the standby, which has every write before it too), unless ASYNC; a write whose
 * outcome is unknown (its reply lost, an error) may be on the primary only. The standby
 * catches up with the primary at any time (Store: replicate), or not before a failover
 * (Store: failover), which replaces the primary's record by the standby's: so the
 * standby holds any past state of the primary no older than its last acknowledged
 * write, as a replication log's prefix does. Reads (a claim that is refused, a Get, a
 * write's definitive "no") are answered by the primary and make nothing durable. */
#if MAXFAILOVER > 0
mtype:state dst = absent;
byte dtok, dctr, dOwner, dResp;
short dLease;
bool dAband;
#ifdef EXPIRY
short dExp;
#endif
#endif
byte failovers;
hidden byte acking;     /* the write being applied is acknowledged to its caller (set by
                         * FAULTY around a call whose reply arrives) */
#ifdef ASYNC
bool ackAhead;          /* ghost: an acknowledged write the standby may lack */
bool asyncLost;         /* ghost: a failover lost an acknowledged write (the ASYNC window) */
#endif

/* The replicas. */
bool up[NREP] = true;   /* the link to the store */
byte sinceDown[NREP] = L; /* ticks since the replica saw the store fail, saturated at L */
byte linkUp[NREP] = L;  /* ghost: sinceDown had the replica's process never restarted: the
                         * ticks since its link was last down (at a tick, or at a call that
                         * failed), saturated at L; a restart does not reset it, so the
                         * windows judge a replica by its real link history, not by what its
                         * process believes */
byte pend[NREP];        /* the response a replica holds for the key (pending), 0: none */
#ifdef BROKEN_LOCAL_CLOCK
short off[NREP];        /* the replica's clock minus the store's */
#endif

/* The network: one held store call. */
bool held;
mtype:opcode hOp = op_none;
byte hAtt, hRep, hTok, hResp;
bool hNt;
bool hHd;               /* ghost: a held takeover claim's replica had reached the store for a
                         * whole lease when it decided (REACHED) */
short hTb;              /* ticks left to its TakeoverBy, saturated at -1 */
byte heldLeft = MAXHELD;
byte outages;

/* The attempts, indexed 1..NATT (FINAL is the progress check). */
#define P_IDLE 0
#define P_DECIDED 1     /* between the first claim and the takeover claim */
#define P_RUN 2         /* the handler runs, the heartbeat renews */
#define P_FIN 3         /* the handler returned: the finishing store call is next */
#define P_HOLD 4        /* the answer is held (pending) and flushed */
#define P_LOSTRUN 5     /* the handler runs after its lease was lost */
#define P_UNCLAIM 6     /* its claim's outcome unknown (503 answered), the claim is resent */
#define P_UNREL 7       /* the resent claim was granted: the key is released */
byte phase[NATT + 2];
bool due[NATT + 2];     /* a renewal or a flush is due (the timer fired) */
short tbyA[NATT + 2];   /* P_DECIDED: ticks left to the decision's TakeoverBy */
bool hdA[NATT + 2];     /* ghost, P_DECIDED: the taker's replica had reached the store for a
                         * whole lease when it decided (REACHED) */
bool alive[NATT + 2];   /* holds the key's token and may still use it */
byte rep[NATT + 2];     /* the replica the attempt reached */
byte kindA[NATT + 2];   /* P_FIN, P_HOLD: what the handler's answer says (K_*), 0 before */
byte ndone;             /* attempts over */
byte crashes;
byte restarts;          /* replica restarts */

/* Ghosts: what the properties speak of. */
byte execs;             /* upstream executions that did (or may have done) the work */
byte winCrash, winAband, winCut;
bool respWin;           /* a window after which the client may hold another answer */
byte seen;              /* the answer the client took as final, 0: none */
byte firstStored;       /* the first response stored, 0: none */
byte quiet;             /* ticks with every attempt over, every link up, nothing held, since
                         * the last restart */

#define WINDOWS (winCrash + winAband + winCut + WIN_TTL)
/* ASYNC: once a failover lost an acknowledged write, the key's guarantees are gone (its
 * key may run again, more than once: a token issued in a lost write may be issued again,
 * and its old owner's calls then act on the new owner's record), unless STRICT_ASYNC. */
#if defined(ASYNC) && !defined(STRICT_ASYNC)
#define AEXC asyncLost
#else
#define AEXC false
#endif
#ifdef STRICT
#define ALLOWED 0       /* no window excuses a second execution */
#else
#define ALLOWED (WINDOWS + (AEXC -> FINAL : 0))
#endif

/* The standby takes the primary's record (replication), or the primary the standby's
 * (a failover). */
#if MAXFAILOVER > 0
#define SYNC_D dst = st; dtok = tok; dctr = ctr; dOwner = owner; dResp = resp; dLease = leaseLeft; dAband = recAband; D_EXP
#define RESTORE_P st = dst; tok = dtok; ctr = dctr; owner = dOwner; resp = dResp; leaseLeft = dLease; recAband = dAband; P_EXP
#define SAME_D (dst == st && dtok == tok && dctr == ctr && dOwner == owner && dResp == resp && dLease == leaseLeft && dAband == recAband && SAME_EXP)
#endif
/* A write applied: when it is acknowledged to its caller, it is durable (on the standby,
 * with every write before it); with ASYNC it need not be. It ends an option's sequence
 * (it is an if with an else, as CHECK). */
#if MAXFAILOVER == 0
#define DURABLE skip
#elif defined(ASYNC)
#define DURABLE if :: acking != 0 -> ackAhead = true :: else -> skip fi
#else
#define DURABLE if :: acking != 0 -> SYNC_D :: else -> skip fi
#endif
#define EXPIRED(rp) (leaseLeft <= CLK(rp))
#define HEALTHY(rp) (sinceDown[rp] >= L)
/* ghost: the replica did reach the store for the whole last lease (what winCut asks of a
 * taker). HEALTHY is what its process believes: it implies REACHED unless a restart
 * forged it (BROKEN_START_HEALTHY). */
#define REACHED(rp) (linkUp[rp] >= L)
/* the replica saw the store fail: its process's health and its link's history */
#define SAW_FAIL(rp) sinceDown[rp] = 0; linkUp[rp] = 0

#define report(a, o) reported = o; printf("OUTCOME attempt=%d %e\n", a, reported)

inline execute(a) {
	execs++;
	printf("EVENT executed attempt=%d (executions %d, windows %d)\n", a, execs, WINDOWS);
	CHECK(execs <= 1 + ALLOWED, inv_once)
}

/* The client gets answer x as final, or the answer is lost on its way. (An option of
 * an if must not begin with an if that has an else: spin then never takes it; each
 * option here begins with a plain guard.) */
inline deliverFinal(x) {
	if
	:: true /* lost */
	:: true ->
	   CHECK(seen == 0 || seen == x || respWin, inv_final);
	   if
	   :: seen == 0 -> seen = x
	   :: else -> skip
	   fi
	fi
}

inline stored(x) {
	CHECK(seen == 0 || seen == x || respWin, inv_final);
	if
	:: firstStored == 0 -> firstStored = x
	:: else -> skip
	fi
}

inline clearRecord() {
	st = absent; tok = 0; leaseLeft = 0; recAband = false; resp = 0; owner = 0; CLEAR_EXP
}

/* A new in-progress record for attempt a at replica rp; takeover when it replaces one. */
inline newRecord(a, rp, takeover, t) {
	ctr++;
#ifdef BROKEN_TAKEOVER_SAME_TOKEN
	if
	:: takeover -> skip
	:: else -> tok = ctr
	fi;
#else
	tok = ctr;
#endif
	CHECK(!takeover || tok > t, inv_token);
	st = in_progress; leaseLeft = L + CLK(rp); recAband = false; owner = a; t = tok; SET_EXP;
	printf("EVENT claimed attempt=%d replica=%d token=%d takeover=%d\n", a, rp, tok, takeover)
}

/* The takeover of a record whose owner is alive: documented only when the owner's
 * replica's link failed within the last lease (it could not renew), and the taker's
 * replica had reached the store for a whole lease (hd, REACHED when it decided) at most
 * F ticks ago (tb, the ticks left to the decision's TakeoverBy, is not negative): the
 * taker reached the store while the owner was cut off. Both are judged on the links'
 * real history (linkUp), not on a process's health, which a restart resets. */
inline liveTakeover(tb, hd) {
	if
	:: alive[owner] ->
		if
		:: linkUp[rep[owner]] < L && hd && tb >= 0 -> winCut++; respWin = true
		:: else -> CHECK(AEXC, inv_takeover)
		fi
	:: else -> skip
	fi
}

#ifdef BROKEN_NO_TAKEOVERBY
#define TBY_OK(tb) true
#else
#define TBY_OK(tb) (tb >= 0)
#endif
#ifdef BROKEN_CLAIM_LIVE_LEASE
#define CLAIMABLE(rp) true
#else
#define CLAIMABLE(rp) EXPIRED(rp)
#endif

/* A claim's own record: an in-progress record with the claim's ID (its own earlier
 * claim, whose answer was lost), which it is granted. BROKEN_CLAIM_ID_IGNORED: the
 * store does not recognise it (a claim sent again finds an in-progress record, 409). */
#ifdef BROKEN_CLAIM_ID_IGNORED
#define OWN(a) false
#else
#define OWN(a) (owner == a)
#endif

/* Store.Claim: a is the claim's ID, nt is NoTakeover, tb the ticks left to TakeoverBy.
 * On r_claimed t is the token; on r_existing sDone, sResp and sExp describe the record
 * as the store saw it. A claim that finds its own record is granted its token, and the
 * grant is a write (it renews the lease), so that its acknowledgement makes the record
 * durable: a grant that only read it (BROKEN_REGRANT_READ) may hand out a token a
 * failover then loses, and issues again. */
inline storeClaim(a, rp, nt, tb, hd, t, r, sDone, sResp, sExp) {
	if
	:: st == absent -> t = 0; newRecord(a, rp, false, t); r = r_claimed; DURABLE
#ifdef EXPIRY
	:: st == done && expLeft <= 0 ->
		/* the key's TTL is over: it is claimed afresh, by design */
		winTTL++; respWin = true; firstStored = 0;
		t = 0; newRecord(a, rp, false, t); r = r_claimed; DURABLE
#endif
#ifdef BROKEN_CLAIM_REPLACES_DONE
	:: st == done -> t = 0; newRecord(a, rp, false, t); r = r_claimed; DURABLE
#endif
	:: st == in_progress && OWN(a) ->
		t = tok; r = r_claimed;
		printf("EVENT claim of attempt %d granted its own record, token=%d\n", a, tok);
#ifdef BROKEN_REGRANT_READ
		skip
#else
		leaseLeft = L + CLK(rp); EXTEND_EXP; DURABLE
#endif
	:: st == in_progress && !OWN(a) && CLAIMABLE(rp) && !nt && TBY_OK(tb) ->
		liveTakeover(tb, hd); t = tok; newRecord(a, rp, true, t); r = r_claimed; DURABLE
	:: else -> r = r_existing; sDone = (st == done); sResp = resp; sExp = EXPIRED(rp)
	fi
}

inline storeExtend(rp, t, r) {
	if
	:: st == in_progress && tok == t ->
#ifndef BROKEN_EXTEND_NOOP
		leaseLeft = L + CLK(rp); EXTEND_EXP;
#endif
		r = r_ok; DURABLE
	:: else -> r = r_lost
	fi
}

#ifdef BROKEN_NO_TOKEN_CHECK
#define TOKOK(t) true
#else
#define TOKOK(t) (tok == t)
#endif

/* Store.Complete is idempotent per token: on a record already done under the same
 * token it writes the response again and succeeds (an acknowledged write), so that an
 * owner whose completion's outcome is unknown resends it until one is acknowledged.
 * BROKEN_CONFIRM_BY_READ is the former rule: a done record is lease lost, and the owner
 * reads the record back to learn whether its completion was stored. */
inline storeComplete(a, t, x, r) {
	if
	:: st == in_progress && TOKOK(t) ->
		CHECK(owner == a || AEXC, inv_stale);
		st = done; resp = x; recAband = false; leaseLeft = 0; SET_EXP; stored(x); r = r_ok;
		printf("EVENT stored response=%d token=%d\n", x, t);
		DURABLE
#ifndef BROKEN_CONFIRM_BY_READ
	:: st == done && tok == t ->
		CHECK(owner == a || AEXC, inv_stale);
		resp = x; SET_EXP; stored(x); r = r_ok;
		printf("EVENT stored again response=%d token=%d\n", x, t);
		DURABLE
#endif
	:: else -> r = r_lost
	fi
}

inline storeRelease(t, r) {
	if
	:: st == in_progress && tok == t -> clearRecord(); r = r_ok; DURABLE
#ifdef BROKEN_RELEASE_NO_CHECK
	:: st != absent && !(st == in_progress && tok == t) -> clearRecord(); r = r_ok; DURABLE
#endif
	:: else -> r = r_lost
	fi
}

inline storeAbandon(t, r) {
	if
	:: st == in_progress && tok == t -> recAband = true; r = r_ok; DURABLE
	:: else -> r = r_lost
	fi
}

/* Store.Get as the former read-back (BROKEN_CONFIRM_BY_READ) read it, on the primary:
 * done under token t. */
inline storeGet(t, r) {
	if
	:: st == done && tok == t -> r = r_ok
	:: else -> r = r_lost
	fi
}

inline apply(op, a, rp, t, x, nt, tb, hd, r, sDone, sResp, sExp) {
	if
	:: op == op_claim -> storeClaim(a, rp, nt, tb, hd, t, r, sDone, sResp, sExp)
	:: op == op_extend -> storeExtend(rp, t, r)
	:: op == op_complete -> storeComplete(a, t, x, r)
	:: op == op_release -> storeRelease(t, r)
	:: op == op_abandon -> storeAbandon(t, r)
	fi
}

inline hold(op, a, rp, t, x, nt, tb, hd) {
	printf("EVENT the network holds a call of attempt %d\n", a);
	held = true; heldLeft--; hOp = op; hAtt = a; hRep = rp; hTok = t; hResp = x; hNt = nt;
	if
	:: op == op_claim && !nt -> hTb = tb; hHd = hd
	:: else -> hTb = 0; hHd = false
	fi
}

/* One store call from replica rp. Over a link that is down it is applied or not, and
 * held by the network (to be delivered later, or never) or not: so it fails, or is
 * applied with its reply lost, or arrives late, or arrives twice; the caller sees an
 * error, and its replica's health records the failure. */
#define FAULTY(rp, r, APPLY, HOLD) \
	if \
	:: up[rp] -> acking = 1; APPLY; acking = 0 \
	:: !up[rp] -> \
		if :: true :: true -> APPLY fi; \
		if :: true :: !held && heldLeft > 0 -> HOLD fi; \
		r = r_err; SAW_FAIL(rp) \
	fi

inline callClaim(a, rp, nt, tb, hd, t, r, sDone, sResp, sExp) {
	FAULTY(rp, r, storeClaim(a, rp, nt, tb, hd, t, r, sDone, sResp, sExp), hold(op_claim, a, rp, t, 0, nt, tb, hd))
}

inline callExtend(a, rp, t, r) {
	FAULTY(rp, r, storeExtend(rp, t, r), hold(op_extend, a, rp, t, 0, false, 0, false))
}

inline callComplete(a, rp, t, x, r) {
	FAULTY(rp, r, storeComplete(a, t, x, r), hold(op_complete, a, rp, t, x, false, 0, false))
}

inline callRelease(a, rp, t, r) {
	FAULTY(rp, r, storeRelease(t, r), hold(op_release, a, rp, t, 0, false, 0, false))
}

inline callAbandon(a, rp, t, r) {
	FAULTY(rp, r, storeAbandon(t, r), hold(op_abandon, a, rp, t, 0, false, 0, false))
}

inline getCall(rp, t, r) {
	if
	:: up[rp] -> storeGet(t, r)
	:: !up[rp] -> r = r_err; SAW_FAIL(rp)
	fi
}

inline replayStored(a, x) {
	CHECK(x == firstStored || AEXC, inv_replay);
	deliverFinal(x);
	report(a, replayed)
}

/* The answer after a claim that was not won: a replay or a 409. */
inline existing(a, r, sDone, sResp) {
	if
	:: sDone -> replayStored(a, sResp)
	:: else -> report(a, conflict)
	fi
}

/* A claim whose outcome is unknown: 503, not executed (nothing forwarded), and the claim
 * is taken back in the background (unclaim). */
inline unknownClaim(a) {
	report(a, store_error);
	phase[a] = P_UNCLAIM; due[a] = false
}

#define K_OK 1          /* the handler's answer says the work was done */
#define K_UNKNOWN 2     /* the outcome is unknown: the key is abandoned */
#define K_NOTDONE 3     /* the work was not done (429, 503, a panic): the key is released */

/* A replica stops holding answer x (Middleware.dropPending). */
inline drop(rp, x) {
	if
	:: pend[rp] == x -> pend[rp] = 0
	:: else -> skip
	fi
}

/* Locals that no longer matter are reset, so that they do not multiply states. */
inline forget() {
	sDone = false; sExp = false; sResp = 0; r = 0
}

/* The attempt is over: whatever it held is gone with it. */
inline quit(a) {
	phase[a] = P_IDLE; due[a] = false; alive[a] = false; rep[a] = 0; kindA[a] = 0;
	tbyA[a] = 0; hdA[a] = false; ndone++
}

/* Attempt a's process dies (an owner crash, or its replica's restart), in whatever phase
 * it is: after its handler returned with the work done and before the answer reached the
 * store (winCrash), or holding the answer, which is lost with the process (winCrash, and
 * the client may hold an answer the store never gets: respWin). Before its handler
 * returned there is nothing to excuse: the work was not done. It reads only globals, so
 * that a restart can crash every attempt of its replica at once. */
inline crash(a) {
	printf("EVENT attempt %d crashed\n", a);
	if
	:: phase[a] == P_FIN && kindA[a] == K_OK -> winCrash++
	:: phase[a] == P_HOLD -> winCrash++; respWin = true; drop(rep[a], a)
	:: else -> skip
	fi;
	quit(a)
}

proctype Attempt(byte a) {
	byte rp, t, x, sResp;
	bool sDone, sExp, lost, rfail;
	mtype:res r;

	atomic {
		/* The replicas are symmetric (every choice open to one is open to the other):
		 * attempt 1 reaches replica 0, with no loss of generality. */
		if
		:: rp = 0
		:: a != 1 -> rp = 1
		fi;
		rep[a] = rp;
		if
		:: pend[rp] != 0 ->
			x = pend[rp];
			CHECK(firstStored == 0 || x == firstStored || respWin || AEXC, inv_replay);
			deliverFinal(x);
			report(a, replayed);
			quit(a); goto over
		:: else -> skip
		fi;
		callClaim(a, rp, true, 0, false, t, r, sDone, sResp, sExp);
		if
		:: r == r_claimed -> phase[a] = P_RUN; alive[a] = true; forget(); goto running
		:: r == r_existing && !sDone && sExp && HEALTHY(rp) ->
#ifdef BROKEN_NO_TAKEOVER
			report(a, conflict); quit(a); goto over
#else
			phase[a] = P_DECIDED; tbyA[a] = F; hdA[a] = REACHED(rp);
			printf("EVENT attempt %d found the lease run out: it will take the key over\n", a)
#endif
#ifdef BROKEN_NO_HEALTH_HOLD
		:: r == r_existing && !sDone && sExp && !HEALTHY(rp) -> phase[a] = P_DECIDED; tbyA[a] = F; hdA[a] = REACHED(rp);
			printf("EVENT attempt %d found the lease run out: it will take the key over, though its replica saw the store fail\n", a)
#endif
		:: r == r_err -> unknownClaim(a); forget(); goto unclaim
		:: else -> existing(a, r, sDone, sResp); quit(a); goto over
		fi
	}
	/* Every step below begins with a guard on the attempt's phase: a restart of its
	 * replica ends it from outside (crash), and its process then takes no step. */
	atomic {
		phase[a] == P_DECIDED ->
		callClaim(a, rp, false, tbyA[a], hdA[a], t, r, sDone, sResp, sExp);
		phase[a] = P_IDLE; tbyA[a] = 0; hdA[a] = false;
		if
		:: r == r_claimed -> phase[a] = P_RUN; alive[a] = true; forget(); goto running
		:: r == r_err -> unknownClaim(a); forget(); goto unclaim
		:: else -> existing(a, r, sDone, sResp); quit(a); goto over
		fi
	}
running:
	do
	:: atomic {
		/* every third of a lease, and again at once after a renewal failed (the real
		 * retry comes within a second, well within a tick) */
		(phase[a] == P_RUN && (due[a] || rfail)) ->
		due[a] = false;
		callExtend(a, rp, t, r);
		if
		:: r == r_lost -> lost = true; alive[a] = false; phase[a] = P_LOSTRUN; rfail = false
		:: r == r_err -> rfail = true
		:: else -> rfail = false
		fi;
		r = 0
	   }
	:: atomic {
		/* the handler returns; its upstream call did the work, or may have, or not */
		(phase[a] == P_RUN || phase[a] == P_LOSTRUN) ->
		if
		:: kindA[a] = K_OK; x = a; execute(a)
#ifndef NO_ABANDON
		:: kindA[a] = K_UNKNOWN; winAband++; execute(a)
#endif
		:: kindA[a] = K_NOTDONE
		fi;
#ifdef BROKEN_SEND_BEFORE_STORE
		if
		:: kindA[a] == K_OK -> deliverFinal(x)
		:: else -> skip
		fi;
#endif
		phase[a] = P_FIN; due[a] = false; rfail = false;
		break
	   }
	:: atomic {
		phase[a] != P_IDLE && crashes < MAXCRASH -> crashes++; crash(a); goto over
	   }
	od;
	/* P_FIN: the finishing call comes before the next tick */
	if
	:: atomic {
		phase[a] == P_FIN && lost -> report(a, lease_lost);
		if
		:: kindA[a] == K_OK -> deliverFinal(x)
		:: else -> skip
		fi;
		quit(a); goto over
	   }
	:: atomic {
		phase[a] == P_FIN && !lost && kindA[a] == K_UNKNOWN ->
		callAbandon(a, rp, t, r);
		report(a, abandoned); quit(a); goto over
	   }
	:: atomic {
		phase[a] == P_FIN && !lost && kindA[a] == K_NOTDONE ->
		callRelease(a, rp, t, r);
		report(a, released); quit(a); goto over
	   }
	:: atomic {
		phase[a] == P_FIN && !lost && kindA[a] == K_OK ->
		callComplete(a, rp, t, x, r);
		if
		:: r == r_ok -> report(a, executed); deliverFinal(x); quit(a); goto over
		:: r == r_lost ->
#ifdef BROKEN_CONFIRM_BY_READ
			/* the former rule: a completion whose answer was lost may have been stored,
			 * and a read of the record says so */
			getCall(rp, t, r);
			if
			:: r == r_ok -> report(a, executed)
			:: else -> report(a, lease_lost)
			fi;
#else
			report(a, lease_lost);
#endif
			deliverFinal(x); quit(a); goto over
		:: r == r_err ->
			pend[rp] = x; phase[a] = P_HOLD; due[a] = false;
			report(a, stored_later); deliverFinal(x)
		fi
	   }
	:: atomic {
		phase[a] == P_FIN && crashes < MAXCRASH -> crashes++; crash(a); goto over
	   }
	fi;
	/* P_HOLD: resend the completion until the store acknowledges it or says it is not
	 * ours (never confirmed by reading the record: a read from a primary a failover may
	 * lose confirms nothing) */
	do
	:: atomic {
		phase[a] == P_HOLD ->
		callComplete(a, rp, t, x, r);
		if
		:: r == r_ok -> drop(rp, x); quit(a); goto over
		:: r == r_lost ->
#ifdef BROKEN_CONFIRM_BY_READ
			getCall(rp, t, r);
			if
			:: r == r_ok -> printf("EVENT attempt %d read its answer stored: it drops it\n", a)
			:: else -> skip
			fi;
#endif
			drop(rp, x); quit(a); goto over
		:: else -> due[a] = false; r = 0
		fi
	   }
	:: atomic {
		phase[a] == P_HOLD && crashes < MAXCRASH -> crashes++; crash(a); goto over
	   }
	od;
	/* P_UNCLAIM, P_UNREL: the claim's outcome is unknown (it may be applied, on the
	 * primary only or durably, or held by the network): it is resent with the same ID,
	 * never taking anything over, until the store answers; granted (the claim's own
	 * record, or a fresh one), the key is released with that token, resent until it is
	 * acknowledged or lease lost. A restart ends it (as it does the held answers); an
	 * owner crash does not (there is no owner: nothing ran). A claim resent over a link
	 * that is down fails without reaching the store: what it could do (be applied with
	 * its reply lost, arrive late) the first claim's unknown outcome does already, and a
	 * claim resent and applied again and again, while the janitor deletes what it
	 * created, would issue tokens without end. */
unclaim:
	do
	:: atomic {
		phase[a] == P_UNCLAIM ->
		if
		:: up[rp] -> callClaim(a, rp, true, 0, false, t, r, sDone, sResp, sExp)
		:: else -> r = r_err; SAW_FAIL(rp)
		fi;
		due[a] = false;
		if
		:: r == r_claimed -> phase[a] = P_UNREL; forget()
		:: r == r_existing ->
			/* what the store answered is not the claim's own record */
			CHECK(!(st == in_progress && owner == a), inv_unclaim);
			quit(a); goto over
		:: else -> forget()
		fi
	   }
	:: atomic {
		phase[a] == P_UNREL ->
		callRelease(a, rp, t, r);
		due[a] = false;
		if
		:: r == r_err -> r = 0
		:: else -> printf("EVENT attempt %d took its claim back\n", a); quit(a); goto over
		fi
	   }
	od;
over:
	skip
}

#define URG(i) (phase[i] == P_FIN || (due[i] && phase[i] != P_DECIDED && phase[i] != P_LOSTRUN && phase[i] != P_IDLE))
#if NATT == 1
#define URGENT URG(1)
#elif NATT == 2
#define URGENT (URG(1) || URG(2))
#elif NATT == 3
#define URGENT (URG(1) || URG(2) || URG(3))
#elif NATT == 4
#define URGENT (URG(1) || URG(2) || URG(3) || URG(4))
#endif

/* The clock: a tick waits for every renewal or flush that is due and every finishing
 * call (a process's timers run at the right rate; its calls take less than a tick). */
proctype Clock() {
	byte i;
end:	do
	:: d_step {
		!URGENT ->
		if
		:: st == in_progress && leaseLeft > LMIN -> leaseLeft--
		:: else -> skip
		fi;
		TICK_EXP;
#if MAXFAILOVER > 0
		if
		:: dst == in_progress && dLease > LMIN -> dLease--
		:: else -> skip
		fi;
		TICK_DEXP;
#endif
		i = 0;
		do
		:: i < NREP ->
			if
			:: !up[i] -> sinceDown[i] = 0
			:: up[i] && sinceDown[i] < L -> sinceDown[i]++
			:: else -> skip
			fi;
			if
			:: !up[i] -> linkUp[i] = 0
			:: up[i] && linkUp[i] < L -> linkUp[i]++
			:: else -> skip
			fi;
			i++
		:: else -> break
		od;
		if
		:: held && hOp == op_claim && !hNt && hTb > -1 -> hTb--
		:: else -> skip
		fi;
		i = 1;
		do
		:: i <= NATT ->
			if
			:: phase[i] == P_RUN || phase[i] == P_HOLD || phase[i] == P_UNCLAIM || phase[i] == P_UNREL -> due[i] = true
			:: phase[i] == P_DECIDED && tbyA[i] > -1 -> tbyA[i]--
			:: else -> skip
			fi;
			i++
		:: else -> break
		od;
		if
		:: up[0] && up[1] && !held && ndone == NATT ->
			if
			:: quiet < QUIET -> quiet++
			:: else -> skip
			fi
		:: else -> quiet = 0
		fi;
		i = 0;
		printf("EVENT tick (lease left %d)\n", leaseLeft)
	   }
	od
}

proctype Links() {
end:	do
	:: atomic { up[0] && outages < MAXOUT -> up[0] = false; outages++; printf("EVENT link 0 down\n") }
	:: atomic { up[1] && outages < MAXOUT -> up[1] = false; outages++; printf("EVENT link 1 down\n") }
	:: atomic { !up[0] -> up[0] = true; printf("EVENT link 0 up\n") }
	:: atomic { !up[1] -> up[1] = true; printf("EVENT link 1 up\n") }
	od
}

proctype Net() {
	mtype:res r;
	bool sDone, sExp;
	byte sResp, t;
end:	do
	:: atomic {
		held -> t = hTok; printf("EVENT the held call of attempt %d arrives\n", hAtt);
		apply(hOp, hAtt, hRep, t, hResp, hNt, hTb, hHd, r, sDone, sResp, sExp);
		held = false; hOp = op_none; hAtt = 0; hRep = 0; hTok = 0; hResp = 0; hNt = false; hTb = 0; hHd = false;
		r = r_ok; sDone = false; sExp = false; sResp = 0; t = 0
	   }
	:: atomic {
		held -> held = false; hOp = op_none; hAtt = 0; hRep = 0; hTok = 0; hResp = 0; hNt = false; hTb = 0; hHd = false
	   }
	od
}

#if MAXFAILOVER > 0
/* The store's standby: it catches up with the primary at any time (the primary's latest
 * state, so that at a failover it holds any past state of the primary's, as a
 * replication log's prefix does); a failover (MAXFAILOVER, a fault) replaces the
 * primary's record by the standby's, which has every acknowledged write (ASYNC: perhaps
 * not the last ones) and any prefix of the others. The replicas' calls go to the new
 * primary; a replica need not see the failover (a call during it fails: an outage). */
proctype Store() {
end:	do
	:: atomic {
		!SAME_D -> SYNC_D;
#ifdef ASYNC
		ackAhead = false;
#endif
		printf("EVENT the standby catches up (%e, token %d)\n", st, tok)
	   }
	:: atomic {
		failovers < MAXFAILOVER -> failovers++;
		printf("EVENT failover: the primary's record (%e, token %d) is replaced by the standby's (%e, token %d)\n", st, tok, dst, dtok);
#ifdef ASYNC
		if
		:: ackAhead && !SAME_D ->
			/* the documented window: the standby lacked acknowledged writes */
			printf("EVENT the failover loses acknowledged writes\n");
			asyncLost = true;
#ifndef STRICT_ASYNC
			respWin = true;
#endif
			skip
		:: else -> skip
		fi;
		ackAhead = false;
#endif
		/* a stored response a failover lost was never acknowledged: its owner holds it
		 * and stores it again, or crashed holding it (winCrash) */
		if
		:: dst == done -> firstStored = dResp
		:: else -> firstStored = 0
		fi;
		RESTORE_P;
		quiet = 0
	   }
	od
}
#endif

#ifdef BROKEN_START_HEALTHY
#define START_SINCE L   /* the new process presumes the store healthy */
#else
#define START_SINCE 0   /* as if it had just seen the store fail (health.settling) */
#endif

/* A replica's process dies and a new one takes its place: every attempt it runs crashes
 * (crash, as an owner crash: a held answer is lost with the process), and the new
 * process knows nothing of the lease before it started, in which an outage it never saw
 * may have kept a live owner on the other replica from renewing: its health starts as if
 * it had just seen the store fail, which holds its takeovers (and a held-back janitor)
 * back for a lease. A call the old process sent and the network holds may still arrive.
 * The restart is a fault: the progress check waits for a quiet lease after it. */
inline restart(rp) {
	restarts++;
	printf("EVENT replica %d restarts\n", rp);
	i = 1;
	do
	:: i <= NATT ->
		if
		:: phase[i] != P_IDLE && rep[i] == rp -> crash(i)
		:: else -> skip
		fi;
		i++
	:: else -> break
	od;
	i = 0;
	pend[rp] = 0;
	sinceDown[rp] = START_SINCE;
	quiet = 0
}

proctype Restart() {
	byte i;
end:	do
	:: atomic { restarts < MAXRESTART -> restart(0) }
	:: atomic { restarts < MAXRESTART -> restart(1) }
	od
}

#ifdef EXPIRY
/* The janitor deletes a record whose TTL is over, unless it is in progress with its
 * lease running. Without JanitorConfig.Middleware nothing holds it back after the store
 * failed, as takeovers are: right
 * after an outage of every replica that outlasted a record's TTL it deletes the record
 * of a live owner that could not renew or store its answer, and a retry runs the
 * request again: a documented window (winOutage), which -DSTRICT_TTL does not excuse.
 * JANITOR_HELD_BACK (a replica deletes an in-progress record only when it could take it
 * over) and JANITOR_DONE_ONLY (in-progress records are left to claims) close it. */
proctype Janitor() {
end:	do
	:: atomic {
#ifdef JANITOR_DONE_ONLY
		/* an in-progress record is left to a claim, which health holds back */
		st == done && expLeft <= 0 ->
#elif defined(JANITOR_HELD_BACK)
		/* run by a replica that deletes an in-progress record only when it could take
		 * it over: when it saw no store failure for a lease, and its process has run
		 * for one (Middleware.sweepWait: a restart starts as a failure) */
		st != absent && expLeft <= 0 && (st == done || leaseLeft <= 0 && (up[0] && HEALTHY(0) || up[1] && HEALTHY(1))) ->
#else
		st != absent && expLeft <= 0 && (st == done || leaseLeft <= 0) ->
#endif
		printf("EVENT the janitor deletes the expired record (%e)\n", st);
		if
		:: st == done -> winTTL++; respWin = true; firstStored = 0
		:: st == in_progress && alive[owner] && linkUp[rep[owner]] < L &&
		   (up[0] && REACHED(0) || up[1] && REACHED(1)) ->
			/* as a takeover of an owner cut off, by a replica that reaches the store */
			winCut++; respWin = true
		:: st == in_progress && alive[owner] && linkUp[rep[owner]] < L &&
		   !(up[0] && REACHED(0) || up[1] && REACHED(1)) ->
			/* the record's TTL ran out during an outage of every replica, while its
			 * owner could not renew it: the documented window, unless STRICT_TTL */
#ifndef STRICT_TTL
			winOutage++; respWin = true
#else
			skip
#endif
		:: else -> skip
		fi;
		clearRecord()
	   }
	od
}
#endif

/* Once every attempt is over, nothing is in flight and every link has been up for
 * QUIET ticks with no restart, a retry at either replica claims the key or replays it. */
proctype Final() {
	byte rp, t, sResp;
	bool sDone, sExp;
	mtype:res r;
end:	atomic {
		quiet >= QUIET && up[0] && up[1] && !held ->
		if
		:: rp = 0
		:: rp = 1
		fi;
		rep[FINAL] = rp;
		callClaim(FINAL, rp, true, 0, false, t, r, sDone, sResp, sExp);
		if
		:: r == r_existing && !sDone && sExp && HEALTHY(rp) ->
#ifndef BROKEN_NO_TAKEOVER
			callClaim(FINAL, rp, false, F, REACHED(rp), t, r, sDone, sResp, sExp)
#else
			skip
#endif
		:: else -> skip
		fi;
		if
		:: r == r_claimed ->
			/* the retry runs the request: a execution like any other */
			CHECK(seen == 0 || respWin, inv_final);
			execute(FINAL)
		:: r == r_existing && sDone -> replayStored(FINAL, sResp)
		:: else -> CHECK(false, inv_progress)
		fi
	}
}

init {
	byte i;
	atomic {
#ifdef BROKEN_LOCAL_CLOCK
		if
		:: off[1] = S
		:: off[1] = -S
		fi;
#endif
		run Clock();
		run Links();
		run Net();
		i = 1;
		do
		:: i <= NATT -> run Attempt(i); i++
		:: else -> break
		od;
		run Final();
#if MAXRESTART > 0
		run Restart();
#endif
#if MAXFAILOVER > 0
		run Store();
#endif
#ifdef EXPIRY
		run Janitor();
#endif
		i = 0
	}
}
