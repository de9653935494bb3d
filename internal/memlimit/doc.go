// Package memlimit gives the Go runtime a soft memory limit below the
// memory limit of the container the process runs in.
//
// Without one, the collector lets the heap grow to twice what is live
// whatever the container allows, and a burst of garbage gets the process
// killed for memory it did not need. With a soft limit the collector runs
// more often as the process nears the limit instead. A GOMEMLIMIT in the
// environment is the operator's choice and is left as it is; outside a
// cgroup with a memory limit nothing changes.
package memlimit
