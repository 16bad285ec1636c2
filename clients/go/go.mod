module github.com/echomq/echomq-sidecar/clients/go

go 1.23.0

require (
	google.golang.org/grpc v1.74.3
	google.golang.org/protobuf v1.36.12
)

require (
	golang.org/x/net v0.40.0 // indirect
	golang.org/x/sys v0.33.0 // indirect
	golang.org/x/text v0.25.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250528174236-200df99c418a // indirect
)
