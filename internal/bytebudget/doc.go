// Package bytebudget bounds the memory a transport's source holds in
// received messages that its handlers have not finished: a byte count that
// receivers acquire from before they take messages, first come, first
// served, and release as the messages are settled.
package bytebudget
