package fork

// WalkParallel is walkParallel, for the tests of package fork_test.
var WalkParallel = walkParallel
