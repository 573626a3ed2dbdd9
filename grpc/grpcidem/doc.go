// Package grpcidem gives unary gRPC calls the Idempotency-Key contract of package
// idempotency, with its engine: the same stores (memstore, sqlitestore, pgstore,
// redisstore), atomic claims, leases and fencing tokens, held answers during a store
// outage, waits for a duplicate in flight, expiry and the janitor. A client sends one
// key with every attempt of a logical call; the method runs once, and every retry gets
// the stored answer again.
//
//	ic, err := grpcidem.New(grpcidem.Config{Idempotency: idempotency.Config{
//		Store: store, // any idempotency.Store
//	}})
//	srv := grpc.NewServer(ic.ServerOptions()...)
//	…
//	srv.GracefulStop()
//	ic.Shutdown(ctx) // stores the answers held during a store outage
//
// # Keys and scopes
//
// The key comes from the idempotency-key metadata entry (MetadataKey, the default, the
// entry grpcretry's AutoKey sends) or from a string field of the request (FieldKey: an
// AIP-155 request_id), or either (FirstKey). The scope, the caller the key belongs to,
// is a hash of the authorization metadata by default (AuthorizationScope); MetadataScope
// trusts an entry the authentication layer sets, PeerScope the verified client
// certificate of a mutual-TLS connection. Two scopes never share a record.
//
// A call is fingerprinted by its full method name and the deterministic encoding of its
// request message: the same key with another method or another request is a reused key.
//
// Which methods need a key: Config.Protect; by default every method but those whose
// descriptor declares idempotency_level NO_SIDE_EFFECTS or IDEMPOTENT. A protected call
// without a key is refused with INVALID_ARGUMENT unless Config.KeyOptional.
//
// # Answers
//
// The method's answer is stored whole: the response message, or the status with its
// message and details, and the header and trailer metadata it set (grpc.SetHeader,
// grpc.SendHeader, grpc.SetTrailer). A header the method sends with SendHeader is sent
// with the answer instead, once it is stored; a unary call's client receives it with
// the answer either way. A replay carries the same, with the header metadata
// idempotent-replayed: true (ReplayedMetadata). A replay is decoded into the method's
// response type, found through Config.Resolver (the global registries of generated
// code by default); for a method the Resolver does not know, the stored bytes are
// returned as the unknown fields of an empty message, which gRPC sends as they are.
//
// What the method returned decides what is stored:
//
//	the method returned                     the key                 why
//	a response (OK)                         stored, replayed        the work was done
//	UNAVAILABLE                             released: a retry runs  the method says it did not do the work (overloaded, a
//	                                                                dependency down), and clients retry it
//	RESOURCE_EXHAUSTED                      released: a retry runs  the method refused the work (quota, rate limit)
//	a panic                                 released, panic goes on the method did not finish; nothing was answered
//	CANCELED or DEADLINE_EXCEEDED after     released: a retry runs  the method gave up with its caller, who is gone: as the
//	  the caller left (its context done)                            HTTP middleware releases a request whose client left
//	                                                                before any answer
//	any other status, INTERNAL and UNKNOWN  stored, replayed        the method began and decided: its failure may follow
//	  included                                                      work done (a charge made, then a failed write), and
//	                                                                only a new key may run it again
//
// A method that failed before any work with another code, and wants the key released,
// calls Claim.Release (idempotency.ClaimFromContext) before returning. A method whose
// work must outlive its caller (a client that gives up mid-call still wants the answer
// on its retry) runs it on idempotency.Detach's context.
//
// A duplicate of a call in flight waits for its answer (ConflictWait, the default here),
// up to Idempotency.WaitTimeout, and gets it replayed; with ConflictReject it is answered
// at once, as below.
//
// The interceptor's own answers:
//
//	case                                 code                 details
//	the key in flight (ConflictReject,   ABORTED              ErrorInfo IDEMPOTENCY_KEY_IN_FLIGHT, RetryInfo: retry
//	  or a wait past its bound)                               with the same key after the delay
//	the key used with another request    FAILED_PRECONDITION  ErrorInfo IDEMPOTENCY_KEY_REUSED: never retried, a client bug
//	no key, or a malformed one           INVALID_ARGUMENT     ErrorInfo IDEMPOTENCY_KEY_MISSING / _INVALID
//	the request larger than MaxBody      INVALID_ARGUMENT     IDEMPOTENCY_REQUEST_TOO_LARGE: the same request fails again
//	the store unreachable, or not        UNAVAILABLE          RetryInfo: nothing ran; retry with the same key
//	  durable, or body memory full
//	the caller's deadline passed first   DEADLINE_EXCEEDED    nothing ran
//	a replay whose answer was larger     FAILED_PRECONDITION  IDEMPOTENCY_ANSWER_NOT_STORED: the call ran; its answer
//	  than MaxResponse                                        cannot be given again
//
// ABORTED with a RetryInfo is what grpcretry retries for a conflict; UNAVAILABLE is
// retried by every gRPC client policy; FAILED_PRECONDITION and INVALID_ARGUMENT by none.
//
// # Streaming calls
//
// Streaming calls are not deduplicated: a stream's messages are not one request and
// one answer to store. An unkeyed streaming call passes. A keyed one to a protected
// method is refused with UNIMPLEMENTED before it runs, since its client believes the key
// protects it, unless Config.AllowKeyedStreams lets it through unprotected.
//
// # Metrics and traces
//
// Config.Metrics registers the gateway's collectors (retrysafe_gateway_*) with the full
// method name as the route label. Under a recording server span (otelgrpc's
// StatsHandler), the span gets the outcome (retrysafe.outcome) and the key's hash, and
// the calls of a store wrapped with gateway.WrapStore are spans under it.
//
// # Beside HTTP
//
// One process serving HTTP and gRPC over one store makes the interceptor's engine from
// its HTTP middleware (Config.Shared), so that both share what the process knows of the
// store. The interceptor is a module of its own (github.com/retrysafe/retrysafe/grpc),
// so that the core packages never import gRPC.
package grpcidem
