package dispatch

import "runtime/debug"

func stack() []byte { return debug.Stack() }
