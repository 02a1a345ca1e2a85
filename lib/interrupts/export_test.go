package interrupts

// Key is the derived approval key, for tests that verify signatures with the AI SDK's own code (which takes
// the raw HMAC key). Production code never needs it.
func (s *Signer) Key() []byte { return s.key }
