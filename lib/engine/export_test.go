package engine

// MaxCutReattempts is maxCutReattempts, for the tests of package engine_test.
const MaxCutReattempts = maxCutReattempts
