// Package benchmarks measures whole turns through the real stack (HTTP handler, engine, openai adapter, offline
// model, SQLite or DynamoDB on dynalite), sub-agent jobs through the local job runner (a result's way into its
// thread, and what a delivered job costs the store), and the reaper's tick over a store full of idle threads. It
// holds only benchmarks; `make bench` runs them and the README quotes them.
package benchmarks
