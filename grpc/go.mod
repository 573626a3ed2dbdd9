module github.com/retrysafe/retrysafe/grpc

go 1.26.8

replace github.com/retrysafe/retrysafe => ../
