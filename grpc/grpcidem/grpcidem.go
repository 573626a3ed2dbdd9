package grpcidem

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/retrysafe/retrysafe/gateway"
	"github.com/retrysafe/retrysafe/idempotency"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
)

// ReplayedMetadata is the header metadata entry of an answer replayed from the store:
// "true". A fresh answer does not carry it.
const ReplayedMetadata = "idempotent-replayed"

// ErrorDomain is the domain of the google.rpc.ErrorInfo the interceptor's own failures
// carry, whose reasons are the Reason constants.
const ErrorDomain = "retrysafe.dev"

// Reasons of the interceptor's own failures, in their google.rpc.ErrorInfo.
const (
	ReasonMissingKey       = "IDEMPOTENCY_KEY_MISSING"
	ReasonInvalidKey       = "IDEMPOTENCY_KEY_INVALID"
	ReasonInFlight         = "IDEMPOTENCY_KEY_IN_FLIGHT"
	ReasonKeyReused        = "IDEMPOTENCY_KEY_REUSED"
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	ReasonOverloaded       = "IDEMPOTENCY_OVERLOADED"
	ReasonTooLarge         = "IDEMPOTENCY_REQUEST_TOO_LARGE"
	ReasonBodyOmitted      = "IDEMPOTENCY_ANSWER_NOT_STORED"
	ReasonKeyedStream      = "IDEMPOTENCY_KEYED_STREAM"
)

// DefaultMaxBody is the largest request accepted when Config.Idempotency.MaxBody is
// zero: grpc-go's own default limit on a received message, so that the interceptor
// refuses nothing the server would have taken.
const DefaultMaxBody = 4 << 20

// The content types of the engine's requests and stored answers. They name this
// package's encodings, which no HTTP client sends, so that the engine's handling of any
// wire protocol never applies to them.
const (
	requestType = "application/vnd.retrysafe.grpc-request+proto"
	answerType  = "application/vnd.retrysafe.grpc-answer+proto"
)

// Resolver finds a method's descriptor and its response type, to read its idempotency
// level and to decode a replayed answer into the method's own message type.
// protoregistry's global registries (the default) hold every generated package linked
// into the program.
type Resolver interface {
	FindDescriptorByName(protoreflect.FullName) (protoreflect.Descriptor, error)
	FindMessageByName(protoreflect.FullName) (protoreflect.MessageType, error)
}

type globalResolver struct{}

func (globalResolver) FindDescriptorByName(n protoreflect.FullName) (protoreflect.Descriptor, error) {
	return protoregistry.GlobalFiles.FindDescriptorByName(n)
}

func (globalResolver) FindMessageByName(n protoreflect.FullName) (protoreflect.MessageType, error) {
	return protoregistry.GlobalTypes.FindMessageByName(n)
}

// Config configures the interceptor. The zero value of every field but
// Idempotency.Store (or Shared) means the default documented on it.
type Config struct {
	// Idempotency is the engine's policy, with the meaning it has for the HTTP
	// middleware: Store (required without Shared), Lease, TTL, Conflict (here the zero
	// value means ConflictWait, as for retrysafe gateway: a duplicate of a call in flight
	// waits for its answer; ConflictReject answers it ABORTED), WaitTimeout, MaxWaiters,
	// MaxWaitersPerKey, MaxBodyMemory, MaxBody (default DefaultMaxBody here),
	// MaxResponse, StoreTimeout, FailOpen, Logger, OnStoreCall and Route (default: each
	// method's full name). The fields about HTTP requests — Methods, KeyHeader,
	// KeyPointer, FingerprintIgnore, CanonicalJSON, KeyOptional, Scope, Release,
	// OnOutcome — must be zero: the fields of this Config say those things of calls.
	Idempotency idempotency.Config

	// Shared, when set, makes the interceptor's engine from it (Middleware.With), sharing
	// what the process knows and holds of its store with the HTTP middlewares made from
	// it: health, held answers, waiters and memory bounds. Idempotency.Store must then be
	// nil or Shared's store. Shutdown is then Shared's owner's to call.
	Shared *idempotency.Middleware

	// Key returns a call's key. Default MetadataKey (the idempotency-key metadata);
	// FieldKey reads an AIP-155 request_id, and FirstKey takes either.
	Key KeyFunc

	// Scope returns the scope of a call: the caller its keys belong to. Two scopes never
	// share a record. Default AuthorizationScope; MetadataScope and PeerScope are the
	// others provided.
	Scope func(ctx context.Context) string

	// Protect reports whether a unary method needs a key. Default: every method but
	// those whose descriptor declares idempotency_level NO_SIDE_EFFECTS or IDEMPOTENT
	// (found through Resolver; a method the Resolver does not know is protected).
	Protect func(fullMethod string) bool

	// KeyOptional lets calls to protected methods without a key through unprotected.
	// Default false: they are refused with INVALID_ARGUMENT.
	KeyOptional bool

	// AllowKeyedStreams lets streaming calls that carry a key through, unprotected:
	// the interceptor does not deduplicate streams. Default false: a keyed streaming
	// call to a protected method is refused with UNIMPLEMENTED, so that a client that
	// believes its key protects it learns otherwise before anything runs. Unkeyed
	// streaming calls always pass.
	AllowKeyedStreams bool

	// Resolver finds methods' descriptors and response types. Default: protoregistry's
	// global registries.
	Resolver Resolver

	// Metrics, when set, registers the gateway's collectors (retrysafe_gateway_*) with
	// it and counts calls as the gateway counts requests, with the full method name as
	// the route label: outcomes and durations, store calls (unless
	// Idempotency.OnStoreCall is set), keys in flight, waiters, body memory. Several
	// interceptors may register with one registry: the second adopts the first's
	// collectors.
	Metrics prometheus.Registerer

	// OnOutcome, when set, is called once per call to a protected method with what the
	// interceptor did and the code the caller got.
	OnOutcome func(ctx context.Context, fullMethod string, o idempotency.Outcome, c codes.Code)
}

// Interceptor gives unary gRPC calls the Idempotency-Key contract of the HTTP
// middleware, with its engine: the same stores, claims, leases and fencing, held
// answers, waits and expiry. Make it with New; install Unary and Stream (or
// ServerOptions); call Shutdown once the server has stopped.
type Interceptor struct {
	cfg     Config
	inst    atomic.Pointer[gateway.Instruments]
	root    *idempotency.Middleware
	owned   bool
	base    idempotency.Config // the engine's resolved policy, Route aside
	exec    http.Handler
	methods sync.Map // full method name → *method
	mkMu    sync.Mutex
}

// method is what the interceptor knows of one method, found on its first call.
type method struct {
	name    string
	protect bool
	m       *idempotency.Middleware  // nil until the first unary call
	out     protoreflect.MessageType // nil: replays use a raw carrier
	route   *gateway.RouteInstruments
}

// New returns an interceptor for cfg, or an error when cfg is unusable.
func New(cfg Config) (*Interceptor, error) {
	ic := cfg.Idempotency
	for _, f := range []struct {
		set  bool
		name string
	}{
		{ic.Methods != nil, "Methods (use Protect)"},
		{ic.KeyHeader != "", "KeyHeader (use Key)"},
		{ic.KeyPointer != "", "KeyPointer (use Key with FieldKey)"},
		{ic.FingerprintIgnore != nil, "FingerprintIgnore"},
		{ic.CanonicalJSON, "CanonicalJSON (requests are fingerprinted by their deterministic encoding)"},
		{ic.KeyOptional, "KeyOptional (use Config.KeyOptional)"},
		{ic.Scope != nil, "Scope (use Config.Scope)"},
		{ic.Release != nil, "Release (the codes that release a key are fixed)"},
		{ic.OnOutcome != nil, "OnOutcome (use Config.OnOutcome)"},
	} {
		if f.set {
			return nil, fmt.Errorf("grpcidem: Idempotency.%s is set; it is an HTTP setting", f.name)
		}
	}
	if cfg.Key == nil {
		cfg.Key = MetadataKey
	}
	if cfg.Scope == nil {
		cfg.Scope = AuthorizationScope
	}
	if cfg.Resolver == nil {
		cfg.Resolver = globalResolver{}
	}
	i := &Interceptor{cfg: cfg}
	if cfg.Protect == nil {
		i.cfg.Protect = i.declaredUnsafe
	}
	if ic.Conflict == "" {
		ic.Conflict = idempotency.ConflictWait
	}
	ic.Methods = []string{http.MethodPost}
	ic.Scope = callScope
	ic.Release = released
	if ic.MaxBody == 0 {
		ic.MaxBody = DefaultMaxBody
	}
	if ic.OnStoreCall == nil {
		ic.OnStoreCall = func(op idempotency.StoreOp, took time.Duration, err error) {
			if in := i.inst.Load(); in != nil {
				in.ObserveStore(op, took, err)
			}
		}
	}
	var err error
	if cfg.Shared != nil {
		i.root, err = cfg.Shared.With(ic)
	} else {
		i.root, err = idempotency.New(ic)
		i.owned = true
	}
	if err != nil {
		return nil, fmt.Errorf("grpcidem: %w", err)
	}
	// Without a registry of the caller's the collectors count into one of the
	// interceptor's own, which nothing reads: the same instruments trace calls.
	reg := cfg.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	in, err := gateway.NewInstruments(reg, i.root)
	if err != nil {
		return nil, fmt.Errorf("grpcidem: metrics: %w", err)
	}
	i.inst.Store(in)
	i.base = i.root.Config()
	i.exec = http.HandlerFunc(execute)
	return i, nil
}

// Middleware returns the interceptor's engine: the middleware to give
// idempotency.JanitorConfig.Middleware, or to make HTTP middlewares from (With) that
// share its store state.
func (i *Interceptor) Middleware() *idempotency.Middleware { return i.root }

// Shutdown stores the answers held because the store could not take them, as
// idempotency.Middleware.Shutdown does, when the interceptor made its engine (no
// Config.Shared). Call it after the gRPC server has stopped.
func (i *Interceptor) Shutdown(ctx context.Context) error {
	if !i.owned {
		return nil
	}
	return i.root.Shutdown(ctx)
}

// ServerOptions returns the options that install the interceptor's unary and stream
// interceptors, chained after any the server has.
func (i *Interceptor) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(i.Unary), grpc.ChainStreamInterceptor(i.Stream)}
}

// declaredUnsafe is the default Protect: a method is protected unless its descriptor
// says it has no side effects or is idempotent by itself.
func (i *Interceptor) declaredUnsafe(fullMethod string) bool {
	md := i.descriptor(fullMethod)
	if md == nil {
		return true
	}
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok {
		return true
	}
	switch opts.GetIdempotencyLevel() {
	case descriptorpb.MethodOptions_NO_SIDE_EFFECTS, descriptorpb.MethodOptions_IDEMPOTENT:
		return false
	}
	return true
}

func (i *Interceptor) descriptor(fullMethod string) protoreflect.MethodDescriptor {
	name := strings.ReplaceAll(strings.TrimPrefix(fullMethod, "/"), "/", ".")
	d, err := i.cfg.Resolver.FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		return nil
	}
	md, _ := d.(protoreflect.MethodDescriptor)
	return md
}

// method returns what the interceptor knows of fullMethod, with its engine when unary.
func (i *Interceptor) method(fullMethod string, unary bool) (*method, error) {
	if v, ok := i.methods.Load(fullMethod); ok {
		if m := v.(*method); m.m != nil || !unary || !m.protect {
			return m, nil
		}
	}
	i.mkMu.Lock()
	defer i.mkMu.Unlock()
	if v, ok := i.methods.Load(fullMethod); ok {
		if m := v.(*method); m.m != nil || !unary || !m.protect {
			return m, nil
		}
	}
	m := &method{name: fullMethod, protect: i.cfg.Protect(fullMethod)}
	if unary && m.protect {
		ic := i.base
		ic.Store = nil // the root's
		ic.MaxBodyMemory, ic.MaxWaiters = 0, 0
		if i.cfg.Idempotency.Route == "" {
			ic.Route = fullMethod
		}
		mw, err := i.root.With(ic)
		if err != nil {
			return nil, fmt.Errorf("grpcidem: %s: %w", fullMethod, err)
		}
		m.m = mw
		if md := i.descriptor(fullMethod); md != nil {
			if mt, err := i.cfg.Resolver.FindMessageByName(md.Output().FullName()); err == nil {
				m.out = mt
			}
		}
		if in := i.inst.Load(); in != nil {
			m.route = in.Route(fullMethod)
		}
	}
	i.methods.Store(fullMethod, m)
	return m, nil
}

// Stream is the stream interceptor: streaming calls are not deduplicated. An unkeyed
// one, or one to an unprotected method, passes; a keyed one to a protected method is
// refused with UNIMPLEMENTED unless Config.AllowKeyedStreams lets it through
// unprotected.
func (i *Interceptor) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if i.cfg.AllowKeyedStreams {
		return handler(srv, ss)
	}
	md, _ := metadata.FromIncomingContext(ss.Context())
	if len(md.Get(KeyMetadata)) == 0 {
		return handler(srv, ss)
	}
	m, err := i.method(info.FullMethod, false)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if !m.protect {
		return handler(srv, ss)
	}
	return withInfo(codes.Unimplemented, ReasonKeyedStream,
		"grpcidem: "+info.FullMethod+" is a streaming method, which the idempotency interceptor does not protect; the call was refused before it ran, since its key would not keep it from running twice")
}

// call is one unary call on its way through the engine.
type call struct {
	ctx      context.Context
	method   *method
	req      any
	handler  grpc.UnaryHandler
	scope    string
	q        *gateway.Request
	executed bool
	resp     any
	err      error
	ts       *transportStream
}

type callKey struct{}

func callOf(r *http.Request) *call { return r.Context().Value(callKey{}).(*call) }

// callScope is the engine's Scope: the scope the interceptor computed for the call.
func callScope(r *http.Request) string { return callOf(r).scope }

// Unary is the unary interceptor.
func (i *Interceptor) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m, err := i.method(info.FullMethod, true)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if !m.protect {
		return handler(ctx, req)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "grpcidem: %s: the request is a %T, not a protocol buffers message", info.FullMethod, req)
	}
	key, err := i.cfg.Key(ctx, info.FullMethod, msg)
	if err != nil {
		err = withInfo(codes.InvalidArgument, ReasonInvalidKey, "grpcidem: invalid idempotency key: "+err.Error())
		return nil, i.report(ctx, m.name, idempotency.OutcomeInvalidKey, err)
	}
	if key == "" {
		if i.cfg.KeyOptional {
			return handler(ctx, req)
		}
		err = withInfo(codes.InvalidArgument, ReasonMissingKey,
			"grpcidem: "+info.FullMethod+" needs an idempotency key (the "+KeyMetadata+" metadata entry, or the request's key field), so that a retry cannot run it twice")
		return nil, i.report(ctx, m.name, idempotency.OutcomeMissingKey, err)
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "grpcidem: encoding the request: %v", err)
	}
	c := &call{ctx: ctx, method: m, req: req, handler: handler, scope: i.cfg.Scope(ctx)}
	r := (&http.Request{
		Method:        http.MethodPost,
		URL:           &url.URL{Path: info.FullMethod},
		Proto:         "HTTP/2.0",
		ProtoMajor:    2,
		Header:        http.Header{"Idempotency-Key": {quoteKey(key)}, "Content-Type": {requestType}},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Host:          "grpc",
		RequestURI:    info.FullMethod,
	}).WithContext(context.WithValue(ctx, callKey{}, c))
	if m.route != nil {
		r, c.q = m.route.Start(r)
	}
	w := &collector{h: http.Header{}}
	outcome, _ := m.m.Serve(w, r, i.exec)
	resp, err := i.answer(ctx, c, w, outcome)
	if c.q != nil {
		c.q.End(outcome, w.status)
	}
	if i.cfg.OnOutcome != nil {
		i.cfg.OnOutcome(ctx, m.name, outcome, status.Code(err))
	}
	return resp, err
}

// report tells OnOutcome of a call refused before the engine saw it.
func (i *Interceptor) report(ctx context.Context, method string, o idempotency.Outcome, err error) error {
	if i.cfg.OnOutcome != nil {
		i.cfg.OnOutcome(ctx, method, o, status.Code(err))
	}
	return err
}

// execute runs the method as the owner of its key and writes its answer, as an
// envelope, for the engine to store and send.
func execute(w http.ResponseWriter, r *http.Request) {
	c := callOf(r)
	c.ts = &transportStream{method: c.method.name}
	ctx := grpc.NewContextWithServerTransportStream(r.Context(), c.ts)
	if c.q != nil {
		done := c.q.Forwarding()
		defer done()
	}
	c.resp, c.err = c.handler(ctx, c.req)
	c.executed = true
	if c.err != nil && r.Context().Err() != nil {
		if code := errStatus(c.err).Code(); code == codes.Canceled || code == codes.DeadlineExceeded {
			// The method gave up with its caller, who is gone: nothing is written, so the
			// engine releases the key, as it does for a request whose client left before
			// any answer.
			return
		}
	}
	e := envelope{header: c.ts.header, trailer: c.ts.trailer}
	if c.err != nil {
		s := errStatus(c.err)
		e.code = s.Code()
		e.status, _ = proto.Marshal(s.Proto())
	} else if m, ok := c.resp.(proto.Message); !ok {
		e.code = codes.Internal
		e.status, _ = proto.Marshal(status.Newf(codes.Internal, "grpcidem: the response is a %T, not a protocol buffers message", c.resp).Proto())
	} else if b, err := (proto.MarshalOptions{Deterministic: true}).Marshal(m); err != nil {
		e.code = codes.Internal
		e.status, _ = proto.Marshal(status.Newf(codes.Internal, "grpcidem: encoding the response: %v", err).Proto())
	} else {
		e.response, e.hasResp = b, true
	}
	w.Header().Set("Content-Type", answerType)
	w.WriteHeader(httpStatus(e.code))
	_, _ = w.Write(e.marshal())
}

// errStatus is the status grpc-go sends for a handler's error: its own status, or a
// context error's code, or UNKNOWN.
func errStatus(err error) *status.Status {
	if s, ok := status.FromError(err); ok {
		return s
	}
	return status.FromContextError(err)
}

// answer turns what the engine wrote into the call's result: the method's answer (this
// call's own, or one replayed from the store), or the engine's refusal as a status.
func (i *Interceptor) answer(ctx context.Context, c *call, w *collector, outcome idempotency.Outcome) (any, error) {
	if w.h.Get("Content-Type") != answerType {
		return nil, refusal(w, outcome)
	}
	replayed := w.h.Get("Idempotent-Replayed") == "true"
	if replayed && w.h.Get("Idempotent-Body-Omitted") == "true" {
		return nil, withInfo(codes.FailedPrecondition, ReasonBodyOmitted,
			"grpcidem: this call was executed, but its answer was larger than the stored-answer limit (MaxResponse) and cannot be replayed")
	}
	if c.executed && !replayed && w.status != 0 {
		if err := setMetadata(ctx, c.ts.header, c.ts.trailer, false); err != nil {
			return nil, err
		}
		if c.err != nil {
			return nil, c.err
		}
		return c.resp, nil
	}
	e, err := unmarshalEnvelope(w.body.Bytes())
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := setMetadata(ctx, e.header, e.trailer, replayed); err != nil {
		return nil, err
	}
	if e.code != codes.OK {
		s := &spb.Status{}
		if err := proto.Unmarshal(e.status, s); err != nil {
			return nil, status.Errorf(codes.Internal, "grpcidem: decoding the stored status: %v", err)
		}
		s.Code = int32(e.code)
		return nil, status.FromProto(s).Err()
	}
	var out proto.Message
	if c.method.out != nil {
		out = c.method.out.New().Interface()
		if err := proto.Unmarshal(e.response, out); err != nil {
			return nil, status.Errorf(codes.Internal, "grpcidem: decoding the stored response: %v", err)
		}
	} else {
		// The response type is not known: the stored bytes travel as the unknown fields
		// of an empty message, which encodes them as they are.
		carrier := &emptypb.Empty{}
		carrier.ProtoReflect().SetUnknown(e.response)
		out = carrier
	}
	return out, nil
}

func setMetadata(ctx context.Context, header, trailer metadata.MD, replayed bool) error {
	if replayed {
		header = header.Copy()
		if header == nil {
			header = metadata.MD{}
		}
		header.Set(ReplayedMetadata, "true")
	}
	if len(header) > 0 {
		if err := grpc.SetHeader(ctx, header); err != nil {
			return status.Errorf(codes.Internal, "grpcidem: setting the answer's header: %v", err)
		}
	}
	if len(trailer) > 0 {
		if err := grpc.SetTrailer(ctx, trailer); err != nil {
			return status.Errorf(codes.Internal, "grpcidem: setting the answer's trailer: %v", err)
		}
	}
	return nil
}

// refusal is the status of an answer the engine wrote itself (a problem): a code a
// client's retry policy reads right, the problem's text as the message, and a
// RetryInfo with the engine's Retry-After when a retry with the same key may succeed.
func refusal(w *collector, outcome idempotency.Outcome) error {
	var p idempotency.Problem
	_ = json.Unmarshal(w.body.Bytes(), &p)
	msg := p.Title
	if p.Detail != "" {
		msg += ": " + p.Detail
	}
	if msg == "" {
		msg = string(outcome)
	}
	msg = "grpcidem: " + msg
	var delay time.Duration
	if s, err := strconv.Atoi(w.h.Get("Retry-After")); err == nil && s > 0 {
		delay = time.Duration(s) * time.Second
	}
	switch outcome {
	case idempotency.OutcomeConflict:
		return withRetry(codes.Aborted, ReasonInFlight, msg, max(delay, time.Second))
	case idempotency.OutcomeMismatch:
		return withInfo(codes.FailedPrecondition, ReasonKeyReused, msg)
	case idempotency.OutcomeMissingKey:
		return withInfo(codes.InvalidArgument, ReasonMissingKey, msg)
	case idempotency.OutcomeInvalidKey:
		return withInfo(codes.InvalidArgument, ReasonInvalidKey, msg)
	case idempotency.OutcomeTooLarge:
		return withInfo(codes.InvalidArgument, ReasonTooLarge, msg)
	case idempotency.OutcomeOverloaded:
		return withRetry(codes.Unavailable, ReasonOverloaded, msg, max(delay, time.Second))
	case idempotency.OutcomeStoreError, idempotency.OutcomeNotDurable:
		return withRetry(codes.Unavailable, ReasonStoreUnavailable, msg, max(delay, time.Second))
	case idempotency.OutcomeDeadline:
		return status.Error(codes.DeadlineExceeded, msg)
	case idempotency.OutcomeClientGone:
		return status.Error(codes.Canceled, msg)
	}
	if w.status == 0 {
		return status.Error(codes.Canceled, "grpcidem: the call ended before any answer")
	}
	return status.Error(codes.Internal, msg)
}

func withInfo(c codes.Code, reason, msg string) error {
	s, err := status.New(c, msg).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain})
	if err != nil {
		return status.Error(c, msg)
	}
	return s.Err()
}

func withRetry(c codes.Code, reason, msg string, d time.Duration) error {
	s, err := status.New(c, msg).WithDetails(
		&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	if err != nil {
		return status.Error(c, msg)
	}
	return s.Err()
}

// collector is the engine's ResponseWriter: it keeps what the engine answers the call
// with, for answer to turn into the call's result.
type collector struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (w *collector) Header() http.Header { return w.h }

func (w *collector) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
}

func (w *collector) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(p)
}

// transportStream keeps the metadata a method sets while it runs, so that it is stored
// with its answer and sent with it (or with its replay). A header the method sends with
// grpc.SendHeader is kept too, and sent with the answer: a unary call's header reaches
// its client with the answer either way.
type transportStream struct {
	method  string
	mu      sync.Mutex
	header  metadata.MD
	trailer metadata.MD
}

func (s *transportStream) Method() string { return s.method }

func (s *transportStream) SetHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.header = metadata.Join(s.header, md)
	return nil
}

func (s *transportStream) SendHeader(md metadata.MD) error { return s.SetHeader(md) }

func (s *transportStream) SetTrailer(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trailer = metadata.Join(s.trailer, md)
	return nil
}

var _ grpc.ServerTransportStream = (*transportStream)(nil)
