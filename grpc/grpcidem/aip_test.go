package grpcidem_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"github.com/retrysafe/retrysafe/grpc/grpcidem"
	"github.com/retrysafe/retrysafe/idempotency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// things is an AIP-155 style API, built at run time: CreateThing carries its key in
// request_id; GetThing is declared without side effects.
//
//	message CreateThingRequest { string request_id = 1; string name = 2; }
//	message Thing { string name = 1; int64 execution = 2; }
//	service Things {
//	  rpc CreateThing(CreateThingRequest) returns (Thing);
//	  rpc GetThing(CreateThingRequest) returns (Thing) { option idempotency_level = NO_SIDE_EFFECTS; }
//	}
type things struct {
	files             *protoregistry.Files
	types             *protoregistry.Types
	request, response protoreflect.MessageType
}

func newThings(t *testing.T) *things {
	t.Helper()
	str := descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()
	i64 := descriptorpb.FieldDescriptorProto_TYPE_INT64.Enum()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	field := func(name string, n int32, typ *descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(n), Type: typ, Label: opt, JsonName: proto.String(name)}
	}
	fd := &descriptorpb.FileDescriptorProto{
		Name: proto.String("retrysafe/test/things.proto"), Package: proto.String("retrysafe.test"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("CreateThingRequest"), Field: []*descriptorpb.FieldDescriptorProto{field("request_id", 1, str), field("name", 2, str)}},
			{Name: proto.String("Thing"), Field: []*descriptorpb.FieldDescriptorProto{field("name", 1, str), field("execution", 2, i64)}},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: proto.String("Things"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: proto.String("CreateThing"), InputType: proto.String(".retrysafe.test.CreateThingRequest"), OutputType: proto.String(".retrysafe.test.Thing")},
			{Name: proto.String("GetThing"), InputType: proto.String(".retrysafe.test.CreateThingRequest"), OutputType: proto.String(".retrysafe.test.Thing"),
				Options: &descriptorpb.MethodOptions{IdempotencyLevel: descriptorpb.MethodOptions_NO_SIDE_EFFECTS.Enum()}},
		}}},
	}
	file, err := protodesc.NewFile(fd, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	th := &things{files: &protoregistry.Files{}, types: &protoregistry.Types{}}
	if err := th.files.RegisterFile(file); err != nil {
		t.Fatal(err)
	}
	th.request = dynamicpb.NewMessageType(file.Messages().ByName("CreateThingRequest"))
	th.response = dynamicpb.NewMessageType(file.Messages().ByName("Thing"))
	for _, mt := range []protoreflect.MessageType{th.request, th.response} {
		if err := th.types.RegisterMessage(mt); err != nil {
			t.Fatal(err)
		}
	}
	return th
}

func (th *things) FindDescriptorByName(n protoreflect.FullName) (protoreflect.Descriptor, error) {
	return th.files.FindDescriptorByName(n)
}

func (th *things) FindMessageByName(n protoreflect.FullName) (protoreflect.MessageType, error) {
	return th.types.FindMessageByName(n)
}

func (th *things) newRequest(requestID, name string) proto.Message {
	m := th.request.New()
	m.Set(m.Descriptor().Fields().ByName("request_id"), protoreflect.ValueOfString(requestID))
	m.Set(m.Descriptor().Fields().ByName("name"), protoreflect.ValueOfString(name))
	return m.Interface()
}

func get(m proto.Message, field string) protoreflect.Value {
	r := m.ProtoReflect()
	return r.Get(r.Descriptor().Fields().ByName(protoreflect.Name(field)))
}

// thingsServer counts executions by name.
type thingsServer struct {
	th    *things
	mu    sync.Mutex
	execs map[string]int64
}

func (s *thingsServer) desc() *grpc.ServiceDesc {
	handler := func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor, method string) (any, error) {
		in := s.th.request.New().Interface()
		if err := dec(in); err != nil {
			return nil, err
		}
		run := func(ctx context.Context, req any) (any, error) {
			name := get(req.(proto.Message), "name").String()
			s.mu.Lock()
			s.execs[name]++
			n := s.execs[name]
			s.mu.Unlock()
			out := s.th.response.New()
			out.Set(out.Descriptor().Fields().ByName("name"), protoreflect.ValueOfString(name))
			out.Set(out.Descriptor().Fields().ByName("execution"), protoreflect.ValueOfInt64(n))
			return out.Interface(), nil
		}
		if icpt == nil {
			return run(ctx, in)
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, run)
	}
	return &grpc.ServiceDesc{
		ServiceName: "retrysafe.test.Things",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: "CreateThing", Handler: func(srv any, ctx context.Context, dec func(any) error, i grpc.UnaryServerInterceptor) (any, error) {
				return handler(srv, ctx, dec, i, "/retrysafe.test.Things/CreateThing")
			}},
			{MethodName: "GetThing", Handler: func(srv any, ctx context.Context, dec func(any) error, i grpc.UnaryServerInterceptor) (any, error) {
				return handler(srv, ctx, dec, i, "/retrysafe.test.Things/GetThing")
			}},
		},
	}
}

// TestRequestIDKey: an AIP-155 request_id is the key (FieldKey), a replay is decoded
// into the method's response type found by the Resolver, and a method declared
// NO_SIDE_EFFECTS needs no key.
func TestRequestIDKey(t *testing.T) {
	t.Parallel()
	th := newThings(t)
	srv := &thingsServer{th: th, execs: map[string]int64{}}
	var replayedType protoreflect.FullName
	ic, err := grpcidem.New(grpcidem.Config{
		Idempotency: idempotency.Config{Store: openStore(t, "sqlite")},
		Key:         grpcidem.FirstKey(grpcidem.MetadataKey, grpcidem.FieldKey("request_id")),
		Resolver:    th,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if m, ok := resp.(proto.Message); ok {
			replayedType = m.ProtoReflect().Descriptor().FullName() // what the interceptor returned
		}
		return resp, err
	}), grpc.ChainUnaryInterceptor(ic.Unary))
	g.RegisterService(srv.desc(), srv)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	create := func(method, requestID, name string) (proto.Message, metadata.MD, error) {
		out := th.response.New().Interface()
		var h metadata.MD
		err := conn.Invoke(t.Context(), "/retrysafe.test.Things/"+method, th.newRequest(requestID, name), out, grpc.Header(&h))
		return out, h, err
	}

	a, _, err := create("CreateThing", "req-1", "a")
	if err != nil {
		t.Fatal(err)
	}
	b, h, err := create("CreateThing", "req-1", "a")
	if err != nil || len(h.Get(grpcidem.ReplayedMetadata)) == 0 || get(b, "execution").Int() != 1 || !proto.Equal(a, b) {
		t.Fatalf("retry with the same request_id: %v %v (header %v), want execution 1 replayed", b, err, h)
	}
	if replayedType != "retrysafe.test.Thing" {
		t.Errorf("the replay was returned as a %s, want retrysafe.test.Thing", replayedType)
	}
	if _, _, err := create("CreateThing", "req-1", "other"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("another request with the request_id: %v, want FAILED_PRECONDITION", err)
	}
	if _, _, err := create("CreateThing", "", "nokey"); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no request_id: %v, want INVALID_ARGUMENT", err)
	}
	for range 2 {
		if _, _, err := create("GetThing", "", "read"); err != nil {
			t.Fatalf("GetThing without a key: %v", err)
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.execs["a"] != 1 || srv.execs["read"] != 2 || srv.execs["nokey"] != 0 || srv.execs["other"] != 0 {
		t.Errorf("executions %v, want a:1 read:2 (unprotected), none other", srv.execs)
	}
}
