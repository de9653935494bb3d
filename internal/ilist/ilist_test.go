package ilist

import (
	"slices"
	"testing"
)

type item struct {
	Links[item]
	v int
}

func values(l *List[item, *item]) []int {
	var vs []int
	for e := l.Front(); e != nil; e = e.Next() {
		vs = append(vs, e.v)
	}
	// Walking back from the back must give the same elements reversed.
	var back []int
	for e := l.back; e != nil; e = e.prev {
		back = append(back, e.v)
	}
	slices.Reverse(back)
	if !slices.Equal(vs, back) {
		panic("the list's back links disagree with its front links")
	}
	return vs
}

// Elements come out in the order they were pushed, and removing one from
// the front, the middle or the back keeps the others in order, both ways.
func TestPushBackAndRemove(t *testing.T) {
	var l List[item, *item]
	if l.Front() != nil {
		t.Fatal("a zero list is not empty")
	}
	items := make([]item, 5)
	for i := range items {
		items[i].v = i
		l.PushBack(&items[i])
	}
	for _, c := range []struct {
		remove int
		want   []int
	}{
		{2, []int{0, 1, 3, 4}},
		{0, []int{1, 3, 4}},
		{4, []int{1, 3}},
		{1, []int{3}},
		{3, nil},
	} {
		l.Remove(&items[c.remove])
		if got := values(&l); !slices.Equal(got, c.want) {
			t.Fatalf("after removing %d: %v, want %v", c.remove, got, c.want)
		}
	}
	// A removed element can be pushed again.
	l.PushBack(&items[2])
	l.PushBack(&items[0])
	if got := values(&l); !slices.Equal(got, []int{2, 0}) {
		t.Fatalf("pushed again: %v, want [2 0]", got)
	}
}
