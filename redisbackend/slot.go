package redisbackend

// Redis Cluster hash slots: CRC16/XMODEM of the key (or of its hash tag, the
// part between the first '{' and the next '}' when that part is not empty),
// modulo 16384. Computed here so a batch can be split by slot without asking
// the server.

const numSlots = 16384

var crc16tab = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

func crc16(s string) uint16 { return crc16From(0, s) }

// crc16From continues the CRC16 crc of a string's beginning over s.
func crc16From(crc uint16, s string) uint16 {
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16tab[byte(crc>>8)^s[i]]
	}
	return crc
}

// prefixedSlot is hashSlot(prefix + key) without building the string, for
// a prefix with no '{' or '}' whose CRC16 is prefixCRC.
func prefixedSlot(prefixCRC uint16, key string) uint16 {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j > i+1 {
					return crc16(key[i+1:j]) % numSlots
				}
				return crc16From(prefixCRC, key) % numSlots
			}
		}
		break
	}
	return crc16From(prefixCRC, key) % numSlots
}

// hashSlot returns the cluster slot of key, as CLUSTER KEYSLOT does.
func hashSlot(key string) uint16 {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j > i+1 {
					key = key[i+1 : j]
				}
				return crc16(key) % numSlots
			}
		}
		break
	}
	return crc16(key) % numSlots
}
