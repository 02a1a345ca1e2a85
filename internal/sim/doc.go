// Package sim is a seeded, deterministic fault-schedule simulation of the engine over both stores (issue item
// 13). It holds tests only: see sim_test.go for how a schedule is built and replayed, world_test.go for how the
// sim removes uncontrolled concurrency, check_test.go for the invariants checked after every schedule, and
// keeper_test.go for the schedules in which two runs share one process's keeper (issue 18).
package sim
