package ilist

// Links are an element's place in a [List]; embed them in the element's
// struct. The zero value is an element in no list.
type Links[T any] struct {
	prev, next *T
}

// Next returns the element after this one, or nil.
func (l *Links[T]) Next() *T { return l.next }

// links is how List reaches an element's Links, through the Elem
// constraint.
//
//lint:ignore U1000 called through the Elem constraint, which staticcheck does not follow
func (l *Links[T]) links() *Links[T] { return l }

// Elem is a pointer to a struct that embeds Links of that struct.
type Elem[T any] interface {
	*T
	links() *Links[T]
}

// List is a doubly linked list of elements of type T. The zero value is an
// empty list. It is not safe for concurrent use.
type List[T any, P Elem[T]] struct {
	front, back *T
}

// Front returns the first element, or nil.
func (l *List[T, P]) Front() *T { return l.front }

// PushBack adds e, which must be in no list, at the back.
func (l *List[T, P]) PushBack(e *T) {
	el := P(e).links()
	el.prev, el.next = l.back, nil
	if l.back != nil {
		P(l.back).links().next = e
	} else {
		l.front = e
	}
	l.back = e
}

// Remove takes e, which must be in l, out of it.
func (l *List[T, P]) Remove(e *T) {
	el := P(e).links()
	if el.prev != nil {
		P(el.prev).links().next = el.next
	} else {
		l.front = el.next
	}
	if el.next != nil {
		P(el.next).links().prev = el.prev
	} else {
		l.back = el.prev
	}
	el.prev, el.next = nil, nil
}
