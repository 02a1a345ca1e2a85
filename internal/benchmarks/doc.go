// Package benchmarks measures whole turns through the real stack (HTTP handler, engine, openai adapter, offline
// model, SQLite or DynamoDB Local). It holds only benchmarks; `make bench` runs them and the README quotes them.
package benchmarks
