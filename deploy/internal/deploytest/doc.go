// Package deploytest holds helpers shared by the tests of deploy/: the
// dedupworker binary built once per test binary, and polling with a deadline.
package deploytest
