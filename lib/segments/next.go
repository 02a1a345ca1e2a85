package segments

// Next is the number of the next segment the Segmenter cuts: after Flush, every segment below it is stored. A run
// that hands over (lib/engine handover.go) passes it on, and its continuation's Segmenter starts there
// (SegmenterConfig.StartSeq), so the run's segments stay one sequence across invocations.
func (s *Segmenter) Next() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nextSeq
}
