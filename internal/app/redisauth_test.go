package app

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// Redis refusing the credentials (WRONGPASS for a wrong password of an ACL
// user, NOAUTH for none given to a server that requires one) is blamed on
// redis.password / redis.password_file, not on redis.url, and the right
// password connects. The server is a private one: its ACL and requirepass
// are its own.
func TestRedisRefusedCredentialsNamePassword(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t, "--user", "alice", "on", ">s3cret", "~*", "&*", "+@all")
	ctx := testCtx(t)

	rc := testRedis(srv.URL(), "auth-"+testenv.RandID())
	rc.Username, rc.Password = "alice", "wrong"
	_, err := RedisClient(ctx, &rc)
	assertBlamesPassword(t, "a wrong password (WRONGPASS)", err, "WRONGPASS")

	rc.Password = "s3cret"
	c, err := RedisClient(ctx, &rc)
	if err != nil {
		t.Fatalf("the right password: %v", err)
	}
	defer c.Close()

	// The default user now needs a password: a client without one is
	// refused with NOAUTH.
	if err := srv.Client(t).ConfigSet(ctx, "requirepass", "pw2").Err(); err != nil {
		t.Fatal(err)
	}
	rc = testRedis(srv.URL(), "auth-"+testenv.RandID())
	_, err = RedisClient(ctx, &rc)
	assertBlamesPassword(t, "no password (NOAUTH)", err, "NOAUTH")
}

func assertBlamesPassword(t *testing.T, what string, err error, reply string) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatalf("%s: connected", what)
	case !strings.HasPrefix(err.Error(), "redis.password / redis.password_file"):
		t.Errorf("%s: %q; want it to start with the fields redis.password / redis.password_file", what, err)
	case strings.HasPrefix(err.Error(), "redis.url"):
		t.Errorf("%s: %q blames redis.url", what, err)
	case !strings.Contains(err.Error(), reply):
		t.Errorf("%s: %q; want Redis's %s reply in it", what, err, reply)
	case !errors.Is(err, idempotency.ErrStoreUnavailable):
		t.Errorf("%s: %q does not wrap ErrStoreUnavailable", what, err)
	}
}
