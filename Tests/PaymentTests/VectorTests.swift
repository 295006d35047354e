import Crypto
import Payment
import Testing

/// Every vector of the payment specification's catalogue (§5), pinned. The same values are
/// checked against independent Python implementations by `vectors_check.py`
/// (`Tools/payment-vectors.sh`).
func h(_ s: String) -> [UInt8] { Hex.decode(s)! }
func x(_ b: [UInt8]) -> String { Hex.encode(b) }

@Suite struct TDESDUKPTVectors {
    let bdk = h("0123456789ABCDEFFEDCBA9876543210")
    let iksn = TDESKSN(hex: "FFFF9876543210E00000")!
    var ipek: [UInt8] { try! TDESDUKPT.initialKey(bdk: bdk, ksn: iksn) }
    let data = Array("4012345678909D987".utf8)

    @Test func t1InitialKey() throws {
        #expect(x(ipek) == "6AC292FAA1315B4D858AB3A3D7D5933A")
    }

    @Test func t2t3t5t6TransactionAndPINKeys() throws {
        let rows: [(String, String, String)] = [
            ("FFFF9876543210E00001", "042666B49184CFA368DE9628D0397BC9", "1B9C1845EB993A7A"),
            ("FFFF9876543210E00002", "C46551CEF9FD24B0AA9AD834130D3BC7", "10A01C8D02C69107"),
            ("FFFF9876543210E00003", "0DF3D9422ACA56E547676D07AD6BADFA", "18DC07B94797B466"),
            ("FFFF9876543210E00015", "E161D1956A61F6D2F37AFD7F9CC3699A", "72105C22EBC791E6"),
            ("FFFF9876543210EFF800", "F9CDFEBF4F5B1D9EB3EC12454527E176", "33365F5CC6F23C35"),
            ("FFFF9876543210F00000", "AA4D58DB653EC74A48C75F2F047DD2B5", "73EC88AD0AC5830E"),
        ]
        let clearBlock = try PINBlock.format0(pin: "1234", pan: "4012345678909")
        #expect(x(clearBlock) == "041274EDCBA9876F")
        for (ksn, txn, pinBlock) in rows {
            let key = try TDESDUKPT.transactionKey(initialKey: ipek, ksn: TDESKSN(hex: ksn)!)
            #expect(x(key) == txn, "transaction key for \(ksn)")
            let pinKey = try TDESDUKPT.workingKey(transactionKey: key, variant: .pin)
            #expect(x(try BlockCipher.tdes.encrypt(key: pinKey, clearBlock)) == pinBlock, "PIN block for \(ksn)")
        }
        let key1 = try TDESDUKPT.transactionKey(initialKey: ipek, ksn: TDESKSN(hex: "FFFF9876543210E00001")!)
        #expect(x(try TDESDUKPT.workingKey(transactionKey: key1, variant: .pin)) == "042666B49184CF5C68DE9628D0397B36")
    }

    @Test func t4MACAndDataKeys() throws {
        let rows: [(String, String, String?, String, String?)] = [
            ("FFFF9876543210E00001", "9CCC78173FC4FB64", "20364223C1FF00FA",
             "FC0D53B7EA1FDA9EE68AAF2E70D9B9506229BE2AA993F04F", "1FCC89AF66222F27B903898BB2BC8589CDBFDE5EC6AFCC25"),
            ("FFFF9876543210E00002", "F608A9BCA6FFC311", "D1FCA6BEF05D24D2",
             "A2B4E70F846E63D68775B7215EB4563DFD3037244C61CC13", nil),
            ("FFFF9876543210E00003", "20B59A4FEAC937E3", nil,
             "BD751E65F10E75B6C1D5B1D283496A36C2DE21D993C387A7", nil),
        ]
        let padded = data + [UInt8](repeating: 0, count: 24 - data.count)
        for (ksn, reqMAC, respMAC, reqData, respData) in rows {
            let key = try TDESDUKPT.transactionKey(initialKey: ipek, ksn: TDESKSN(hex: ksn)!)
            let macReq = try TDESDUKPT.workingKey(transactionKey: key, variant: .macRequest)
            #expect(x(try MessageAuthentication.retailMAC(key: macReq, data)) == reqMAC)
            if let respMAC {
                let macResp = try TDESDUKPT.workingKey(transactionKey: key, variant: .macResponse)
                #expect(x(try MessageAuthentication.retailMAC(key: macResp, data)) == respMAC)
            }
            let dataReq = try TDESDUKPT.workingKey(transactionKey: key, variant: .dataRequest)
            #expect(x(try BlockCipher.tdes.encrypt(key: dataReq, padded, mode: .cbc)) == reqData)
            if let respData {
                let dataResp = try TDESDUKPT.workingKey(transactionKey: key, variant: .dataResponse)
                #expect(x(try BlockCipher.tdes.encrypt(key: dataResp, padded, mode: .cbc)) == respData)
            }
        }
        // openemv's response MAC for …E00003 (first four bytes).
        let key3 = try TDESDUKPT.transactionKey(initialKey: ipek, ksn: TDESKSN(hex: "FFFF9876543210E00003")!)
        let resp3 = try MessageAuthentication.retailMAC(key: TDESDUKPT.workingKey(transactionKey: key3, variant: .macResponse), data)
        #expect(x(Array(resp3.prefix(4))) == "BAD4CC9C")
    }

    @Test func t7CounterSpaceAndRollover() throws {
        var count = 0
        var counter: UInt32 = 0
        var last: UInt32 = 0
        while let next = TDESKSN.next(after: counter) {
            #expect(next > counter)
            counter = next
            last = next
            count += 1
        }
        #expect(count == 1_048_575)
        #expect(last == 0x1F_F800)
        // The rollover sequence of A.4.3.
        var ksn = TDESKSN(hex: "FFFF9876543210EFF800")!
        var seen = [ksn.description]
        for _ in 0..<12 {
            ksn.counter = TDESKSN.next(after: ksn.counter)!
            seen.append(ksn.description)
        }
        #expect(seen.map { String($0.suffix(6)) } == ["EFF800", "EFF801", "EFF802", "EFF804", "EFF808", "EFF810",
                                                      "EFF820", "EFF840", "EFF880", "EFF900", "EFFA00", "EFFC00", "F00000"])
        #expect(!TDESKSN.isValid(counter: 0))
        #expect(!TDESKSN.isValid(counter: 0x7FF))
        #expect(throws: DUKPTError.invalidCounter(0x7FF)) {
            var k = iksn
            k.counter = 0x7FF
            _ = try TDESDUKPT.transactionKey(initialKey: ipek, ksn: k)
        }
    }

    @Test func t8IDTECHDataDecryption() throws {
        let ksn = TDESKSN(hex: "FFFF9876543210E0004A")!
        let key = try TDESDUKPT.transactionKey(initialKey: ipek, ksn: ksn)
        let dataKey = try TDESDUKPT.workingKey(transactionKey: key, variant: .dataRequest)
        #expect(x(dataKey) == "6220B23D0B06787F73C17FB6FD9590E0")
        let cipher = h("A096A6F5D1DCBE45B5F77EB2559FEE0411013232E3F42044C0397E3E9E6D9B3A11FB8ADE0712AFD097C23AA86DFDC9DBA0E73A6FD698FD2F")
        let clear = try BlockCipher.tdes.decrypt(key: dataKey, cipher, mode: .cbc)
        #expect(String(decoding: clear.prefix { $0 != 0 }, as: UTF8.self) == "%B5150710200107861^PAYPASS/MASTERCARD^090910140000202?>")
    }
}

@Suite struct AESDUKPTVectors {
    let bdk128 = h("FEDCBA9876543210F1F1F1F1F1F1F1F1")
    let ikid = h("1234567890123456")
    var ik: [UInt8] { try! AESDUKPT.initialKey(bdk: bdk128, initialKeyID: ikid) }
    func ksn(_ counter: UInt32) -> AESKSN { AESKSN(initialKeyID: ikid, counter: counter) }
    let data = Array("4012345678909D987".utf8)

    @Test func a1a2InitialKeys() throws {
        #expect(x(AESDUKPT.derivationData(usage: .initialKeyDerivation, keyType: .aes128, data: ikid))
                == "01018001000200801234567890123456")
        #expect(x(ik) == "1273671EA26AC29AFA4D1084127652A1")
        let ik256 = try AESDUKPT.initialKey(bdk: bdk128 + bdk128, initialKeyID: ikid)
        #expect(x(ik256) == "CE9CE0C101D1138F97FB6CAD4DF045A7083D4EAE2D35A31789D01CCF0949550F")
    }

    @Test func a3a4a6WorkingKeysAndPINBlocks() throws {
        let rows: [(UInt32, String, String, String, String, String)] = [
            (1, "4F21B565BAD9835E112B6465635EAE44", "AF8CB133A78F8DC2D1359F18527593FB", "A2DC23DE6FDE0824A2BC321E08E4B8B7", "A35C412EFD41FDB98B69797C02DCD08F", "A912150391AB65A67E52883D81CE2D15"),
            (2, "2F34D68DE10F68D38091A73B9E7C437C", "D30BDC73EC9714B000BEC66BDB7B6D09", "484C3B06E8562704528CD5B46FB12FB6", "D639514AA33AC43AD9229E433D6D4E5B", "52A00503BD34BA1383F6A7EE9FE2547F"),
            (3, "031504E530365CF81264238540518318", "7D69F01F3B45449F62C7816ECE723268", "A5DF7D9D800CA769766F0C77CA4E6E6C", "EF17F6AB45B4820C93A3DCB21BC491AD", "A5A27E82B43A9A866A93D7ABE89CEF93"),
            (4, "0EEFC7ADA628BA68878DA9165A8A1887", "91A0588318EC2673214271F70137896E", "E6E4679647D8A9057C1FC15537CB4C4E", "B3BD44C08BB6BA27C3BB4711D7D70387", "71B3D0528669498777555A8BE6698E44"),
            (8, "718EE6CF0B27E53D5F7AF99C4D8146A2", "4D9DF3FBEE3448FC3E676D04320A90F5", "6FD572E5D59E618875F193484F9178FB", "650F34204ABD4E57764D61AC3D266FB1", "8308BB857C17F390369F761F8EB358FA"),
        ]
        let random = h("2F69ADDE2E9E7ACE")
        #expect(x(try PINBlock.format4PINField(pin: "1234", random: random)) == "441234AAAAAAAAAA2F69ADDE2E9E7ACE")
        #expect(x(try PINBlock.format4PANField(pan: "4111111111111111")) == "44111111111111111000000000000000")
        for (tc, txn, pin, mac, dataKey, block) in rows {
            let k = try AESDUKPT.transactionKey(initialKey: ik, ksn: ksn(tc))
            #expect(x(k) == txn, "transaction key \(tc)")
            let pinKey = try AESDUKPT.workingKey(transactionKey: k, usage: .pinEncryption, keyType: .aes128, ksn: ksn(tc))
            #expect(x(pinKey) == pin)
            #expect(x(try AESDUKPT.workingKey(transactionKey: k, usage: .macGeneration, keyType: .aes128, ksn: ksn(tc))) == mac)
            #expect(x(try AESDUKPT.workingKey(transactionKey: k, usage: .dataEncryption, keyType: .aes128, ksn: ksn(tc))) == dataKey)
            let enc = try PINBlock.encipherFormat4(pin: "1234", pan: "4111111111111111", key: pinKey, random: random)
            #expect(x(enc) == block, "PIN block \(tc)")
            #expect(try PINBlock.decipherFormat4(enc, pan: "4111111111111111", key: pinKey) == "1234")
        }
        let more: [(UInt32, String)] = [(5, "C2A7AC328A5DA2D6002D62465BFC028B"), (6, "D30F7D9351DA58448A2F5E92B4EE3B7D"),
                                         (7, "A8253CEED9AC042C54F75D35C8352278")]
        for (tc, txn) in more {
            #expect(x(try AESDUKPT.transactionKey(initialKey: ik, ksn: ksn(tc))) == txn)
        }
    }

    @Test func a5RolloverCounters() throws {
        let rows: [(UInt32, String)] = [
            (0x1FFFE, "E21E8C8D347F8561A2BE752DAA85A111"), (0x20000, "F7AE9025468A25D37B7249CFFED224C8"),
            (0x20001, "692C8EA4013645135B36497131DF9D2C"), (0xFFFE_2000, "48E585B694EB0B18D5C35443E163C0BA"),
            (0xFFFF_0000, "F6BA59389BD14A9855BE9727E7C52E3C"),
        ]
        for (tc, txn) in rows {
            #expect(x(try AESDUKPT.transactionKey(initialKey: ik, ksn: ksn(tc))) == txn)
        }
        #expect(AESKSN.next(after: 0x1FFFE) == 0x20000)
        #expect(!AESKSN.isValid(counter: 0x1FFFF))
        #expect(AESKSN.next(after: 0xFFFF_0000) == nil)
        #expect(!AESKSN.isValid(counter: 0xFFFF_0001))
        #expect(throws: DUKPTError.invalidCounter(0x1FFFF)) {
            _ = try AESDUKPT.transactionKey(initialKey: ik, ksn: ksn(0x1FFFF))
        }
        // The advance never yields an invalid counter around the roll-over points.
        for start: UInt32 in [0xFFFE, 0x1FFF0, 0xFFFE_0000, 0xFFFE_FFF0] {
            var c = start
            for _ in 0..<64 {
                guard let n = AESKSN.next(after: c) else { break }
                #expect(n > c && AESKSN.isValid(counter: n))
                c = n
            }
        }
    }

    @Test func a7e1MACsAndDataEncryption() throws {
        let k = try AESDUKPT.transactionKey(initialKey: ik, ksn: ksn(1))
        func key(_ usage: DUKPTKeyUsage, _ type: DUKPTKeyType = .aes128) throws -> [UInt8] {
            try AESDUKPT.workingKey(transactionKey: k, usage: usage, keyType: type, ksn: ksn(1))
        }
        #expect(x(try key(.macVerification)) == "DBB463945B286C07CD3AD82EE96FD9C9")
        #expect(x(try key(.dataDecryption)) == "16292C6EA8F64C5420A0584BFBC577BE")
        #expect(x(try MessageAuthentication.aesCMAC(key: key(.macGeneration), data)) == "A2EB5C1C35809E58404E873C3C411E31")
        #expect(x(try MessageAuthentication.aesCMAC(key: key(.macVerification), data)) == "DD4E1895FD9BF53D8DAF25568ABF551D")
        #expect(x(try MessageAuthentication.hmac(key: key(.macGeneration, .hmac128), data))
                == "B6F8B3159CD4E140159DA87A68C0FB7AF2F123D222662E98988C76386E8E8A02")
        #expect(x(try MessageAuthentication.hmac(key: key(.macVerification, .hmac128), data))
                == "DDE7CB7BDE05AC9A934919B5D94C37954F2376BAF5D45031A56FE74D94C4B64D")
        let padded = data + [UInt8](repeating: 0, count: 32 - data.count)
        #expect(x(try BlockCipher.aes.encrypt(key: key(.dataEncryption), padded, mode: .cbc))
                == "E5AFA5B408A3310E3D779C8A9A2AE29448BD5B4232582090DB703AF647205A79")
        #expect(x(try BlockCipher.aes.encrypt(key: key(.dataDecryption), padded, mode: .cbc))
                == "84904DFC6B5201A4F1FE2EAA49E70B8C01838EF53030790FF785D630AB3916B4")
    }

    @Test func a8AES256() throws {
        let ik256 = try AESDUKPT.initialKey(bdk: bdk128 + bdk128, initialKeyID: ikid)
        let k = try AESDUKPT.transactionKey(initialKey: ik256, ksn: ksn(1))
        #expect(x(k) == "54AC2B32B145EA4A554CB8BC44B17467063A799856B1CCC2A138D36E8DBF78B3")
        func key(_ usage: DUKPTKeyUsage, _ type: DUKPTKeyType) throws -> String {
            x(try AESDUKPT.workingKey(transactionKey: k, usage: usage, keyType: type, ksn: ksn(1)))
        }
        #expect(try key(.pinEncryption, .aes128) == "09C9C432966811D6B2C3336BAC1B1202")
        #expect(try key(.pinEncryption, .aes256) == "8C1AB7BEE973829E30242E0BBBDD4946D540C98FC1B5BDCF94790001A23FD502")
        #expect(try key(.macGeneration, .aes128) == "F04A1FABD4176E15490CEC82E217A96D")
        #expect(try key(.dataEncryption, .aes128) == "616D59AE91F8CC7016F89FDA29605FA4")
    }

    @Test func e2e3e4PaymentVectors() throws {
        let k = try AESDUKPT.transactionKey(initialKey: ik, ksn: ksn(1))
        let dataKey = try AESDUKPT.workingKey(transactionKey: k, usage: .dataEncryption, keyType: .aes128, ksn: ksn(1))
        let track2 = Array("4111111111111111=30122011000000000000".utf8)
        let enc = try BlockCipher.aes.encrypt(key: dataKey, track2, mode: .cbc, padding: true)
        #expect(x(enc) == "87D45DC64A786FCC6B44187CFD2DFA79B7FFCE3DE57D30ED96F2C549B03B126733DEEDD3F3ED3BDD7E13E04C97E3BD7F")
        #expect(try BlockCipher.aes.decrypt(key: dataKey, enc, mode: .cbc, padding: true) == track2)
        let e3 = "v1|999008881|001|0001ABC|1050|978|Normal|ICC|OnlinePIN|123456789012345600000001|87D45DC64A786FCC6B44187CFD2DFA79B7FFCE3DE57D30ED96F2C549B03B126733DEEDD3F3ED3BDD7E13E04C97E3BD7F|A912150391AB65A67E52883D81CE2D15|"
        #expect(e3.utf8.count == 210)
        let macGen = try AESDUKPT.workingKey(transactionKey: k, usage: .macGeneration, keyType: .aes128, ksn: ksn(1))
        #expect(x(try MessageAuthentication.aesCMAC(key: macGen, Array(e3.utf8))) == "B88DCAB3D757EFCE0E3C469B24502092")
        let e4 = "v1|OP-000001|approved|00|000001|true|false|1050|978|123456789012345600000001|0001ABC"
        let macVer = try AESDUKPT.workingKey(transactionKey: k, usage: .macVerification, keyType: .aes128, ksn: ksn(1))
        #expect(x(try MessageAuthentication.aesCMAC(key: macVer, Array(e4.utf8))) == "51EF28CA2D07956892AEC4E8E3775D6A")
    }
}

@Suite struct PINBlockVectors {
    @Test func p1Format0() throws {
        let block = try PINBlock.format0(pin: "1234", pan: "5544332211009966")
        #expect(x(block) == "041277CDDEEFF669")
        #expect(try PINBlock.decodeFormat0(block, pan: "5544332211009966") == "1234")
        #expect(throws: PINBlockError.malformedBlock) { try PINBlock.decodeFormat0(block, pan: "4012345678909") }
        #expect(throws: PINBlockError.invalidPIN) { try PINBlock.format0(pin: "12a4", pan: "5544332211009966") }
        #expect(throws: PINBlockError.invalidPAN) { try PINBlock.format0(pin: "1234", pan: "55443322") }
    }

    @Test func p2Format4() throws {
        let key = h("00112233445566778899AABBCCDDEEFF")
        #expect(try PINBlock.decipherFormat4(h("E4BE5B623AF7E006AC319E5B93544564"), pan: "1234567890123456", key: key) == "1234")
        #expect(throws: PINBlockError.malformedBlock) {
            try PINBlock.decipherFormat4(h("E4BE5B623AF7E006AC319E5B93544564"), pan: "4111111111111111", key: key)
        }
        // Random fill: two encipherments differ and both decode.
        let a = try PINBlock.encipherFormat4(pin: "987654", pan: "4111111111111111", key: key)
        let b = try PINBlock.encipherFormat4(pin: "987654", pan: "4111111111111111", key: key)
        #expect(a != b)
        #expect(try PINBlock.decipherFormat4(b, pan: "4111111111111111", key: key) == "987654")
    }
}

@Suite struct KeyBlockVectors {
    @Test func k1k5Unwrap() throws {
        let rows: [(String, String, String)] = [
            ("89E88CF7931444F334BD7547FC3F380C", "A0072P0TE00E0000F5161ED902807AF26F1D62263644BD24192FDB3193C730301CEE8701", "F039121BEC83D26B169BDCD5B22AAF8F"),
            ("DD7515F2BFC17F85CE48F3CA25CB21F6", "B0080P0TE00E000094B420079CC80BA3461F86FE26EFC4A3B8E4FA4C5F5341176EED7B727B8A248E", "3F419E1CB7079442AA37474C2EFBF8B8"),
            ("B8ED59E0A279A295E9F5ED7944FD06B9", "C0096B0TX12S0100KS1800604B120F9292800000BFB9B689CB567E66FC3FEE5AD5F52161FC6545B9D60989015D02155C", "EDB380DD340BC2620247D445F5B8D678"),
            ("1D22BF32387C600AD97F9B97A51311AC", "B0104B0TX12S0100KS1800604B120F9292800000BB68BE8680A400D9191AD4ECE45B6E6C0D21C4738A52190E248719E24B433627", "E8BC63E5479455E26577F715D587FE68"),
            ("88E1AB2A2E3DD38C1FA039A536500CC8A87AB9D62DC92C01058FA79F44657DE6", "D0112P0AE00E0000B82679114F470F540165EDFBF7E250FCEA43F810D215F8D207E2E417C07156A27E8E31DA05F7425509593D03A457DC34", "3F419E1CB7079442AA37474C2EFBF8B8"),
            ("89E88CF7931444F334BD7547FC3F380C", "A0072P0TE00E0000F5161ED902807AF26F1D62263644BD24D52C8D44AAEDA6D81752022B", "F039121BEC83D26B169BDCD5B22AAF8F"),
        ]
        for (kbpk, block, key) in rows {
            let (header, clear) = try TR31.unwrap(block, kbpk: h(kbpk))
            #expect(x(clear) == key, "\(block.prefix(16))")
            if header.keyUsage == "B0" { #expect(header.optionalBlock("KS") == "00604B120F9292800000") }
        }
        // Check value of A.7.2.1's key (TDES-encrypt zeros, first 3 bytes).
        let kcv = try BlockCipher.tdes.encrypt(key: h("F039121BEC83D26B169BDCD5B22AAF8F"), [UInt8](repeating: 0, count: 8))
        #expect(x(Array(kcv.prefix(3))) == "CB9DEA")
    }

    @Test func derivedVersionDKeys() throws {
        // The A.7.4 intermediate values, reached through wrapping with the block's own padding.
        let kbpk = h("88E1AB2A2E3DD38C1FA039A536500CC8A87AB9D62DC92C01058FA79F44657DE6")
        let header = TR31Header(keyUsage: "P0", algorithm: "A", modeOfUse: "E", keyVersion: "00", exportability: "E")
        let clearKeyData = h("00803F419E1CB7079442AA37474C2EFBF8B81C2965473CE206BB855B01533782")
        let block = try TR31.wrapD(header: header, key: h("3F419E1CB7079442AA37474C2EFBF8B8"), kbpk: kbpk,
                                   padding: Array(clearKeyData[18...]))
        #expect(block == "D0112P0AE00E0000B82679114F470F540165EDFBF7E250FCEA43F810D215F8D207E2E417C07156A27E8E31DA05F7425509593D03A457DC34")
    }

    @Test func versionDRoundTripAndTamper() throws {
        let kbpk = try SecureBytes.random(32)
        let ik = h("1273671EA26AC29AFA4D1084127652A1")
        let header = TR31Header(keyUsage: "B1", algorithm: "A", modeOfUse: "X", optionalBlocks: [.init(id: "IK", data: "1234567890123456")])
        let block = try TR31.wrapD(header: header, key: ik, kbpk: kbpk)
        #expect(block.hasPrefix("D0"))
        let (parsed, key) = try TR31.unwrap(block, kbpk: kbpk)
        #expect(key == ik)
        #expect(parsed.optionalBlock("IK") == "1234567890123456")
        #expect(parsed.keyUsage == "B1" && parsed.modeOfUse == "X")
        #expect(throws: TR31Error.macMismatch) { try TR31.unwrap(block, kbpk: SecureBytes.random(32)) }
        var chars = Array(block)
        let i = chars.count - 40
        chars[i] = chars[i] == "0" ? "1" : "0"
        #expect(throws: TR31Error.macMismatch) { try TR31.unwrap(String(chars), kbpk: kbpk) }
        #expect(throws: TR31Error.self) { try TR31.unwrap("D0016", kbpk: kbpk) }
    }
}

@Suite struct PrimitiveVectors {
    @Test func f1Frame() throws {
        #expect(x(try PaymentFrame.encode(Array("{\"a\":1}".utf8))) == "000000077B2261223A317D")
    }

    @Test func s1Ed25519() throws {
        let sk = h("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
        let pk = try Ed25519.publicKey(privateKey: sk)
        #expect(x(pk) == "D75A980182B10AB7D54BFED3C964073A0EE172F3DAA62325AF021A68F707511A")
        let sig = try Ed25519.sign(privateKey: sk, [])
        #expect(x(sig) == "E5564300C360AC729086E2CC806E828A84877F1EB8E5D974D873E065224901555FB8821590A33BACC61E39701CF9B46BD25BF5F0595BBE24655141438E7A100B")
        #expect(Ed25519.verify(publicKey: pk, signature: sig, []))
        var bad = sig
        bad[0] ^= 1
        #expect(!Ed25519.verify(publicKey: pk, signature: bad, []))
        #expect(!Ed25519.verify(publicKey: pk, signature: sig, [0]))
    }

    @Test func singleDESThroughTripleDES() throws {
        #expect(x(try BlockCipher.desEncrypt(key: h("0123456789ABCDEF"), [UInt8](repeating: 0, count: 8))) == "D5D44FF720683D0D")
    }

    @Test func constantTimeCompareAndErrors() throws {
        #expect(SecureBytes.equal([1, 2, 3], [1, 2, 3]))
        #expect(!SecureBytes.equal([1, 2, 3], [1, 2, 4]))
        #expect(!SecureBytes.equal([1, 2], [1, 2, 3]))
        #expect(throws: CryptoError.self) { try BlockCipher.aes.encrypt(key: [1, 2, 3], [UInt8](repeating: 0, count: 16)) }
        #expect(throws: CryptoError.self) {
            try BlockCipher.aes.decrypt(key: [UInt8](repeating: 7, count: 16), [UInt8](repeating: 0, count: 16), mode: .cbc, padding: true)
        }
    }
}
