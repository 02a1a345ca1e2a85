// Package segments keeps a run's stream as numbered segments (DESIGN "Streaming and resume"): the Segmenter
// batches the encoded frames the run sends its client and writes them, in order, at least every
// DefaultSegmentInterval; the Follower replays them from the start to a resumed reader and tails new ones until the
// final segment. The stored segments are the truth.
//
// Resumed streams as smooth as live ones (issue 18 item 4). A reader in the process that writes the run is fed by
// the Segmenter itself through a Hub (hub.go): stored segments up to a snapshot, then every frame as it is
// appended, with no gap and no duplicate. A reader anywhere else polls the store every DefaultPollAttached and
// marks its presence on the run's claim (agent.RunStore.MarkReader, every half of agent.DefaultReaderPresence);
// the run learns of it with its heartbeats (agent.Claim.ReadersUntil) and flushes every DefaultHurryInterval
// while it lasts (Segmenter.Hurry). A run nobody reads makes no write more than before.
package segments
